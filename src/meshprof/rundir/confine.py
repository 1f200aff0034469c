"""Writing inside a run directory, and only there.

A run directory on a shared file system is often writable by a whole group: anyone there can
replace a folder a rank writes into by a symbolic link to elsewhere (``RUN_DIR/captures`` ->
``/home/someone``), or plant one where a rank will create a file. A training rank writes with
its user's rights, so every file it writes goes through here:

* :func:`open_dir` opens ``RUN_DIR/a/b`` one component at a time, relative to the folder
  before (``openat``), never following a symbolic link, creating what is missing: the
  descriptor it returns is a folder inside the run directory, whatever is renamed or replaced
  afterwards. :func:`write_at` writes a file into such a folder atomically (a new temporary
  file, ``O_EXCL | O_NOFOLLOW``, renamed into place: a link planted at the name is replaced,
  not followed).
* :func:`check_inside` resolves a path (every symbolic link) and checks that it lies under the
  resolved run directory: the check for writers that keep paths (the rank's segments, its live
  record, the watchdog's dumps), made before they create a folder or a file.

Where the platform has no ``openat`` (Windows), :func:`confined_write` falls back to
:func:`check_inside` on the path.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path

from meshprof.errors import MeshprofError
from meshprof.rundir.atomic import FILE_MODE

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
_TMP_FLAGS = (
    os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | getattr(os, "O_BINARY", 0)
)
HAVE_DIR_FD = (
    bool(_NOFOLLOW and _DIRECTORY)
    and os.open in os.supports_dir_fd
    and os.mkdir in os.supports_dir_fd
    and os.rename in os.supports_dir_fd
)
"""Folders are opened component by component (``openat``): Linux, macOS, the BSDs."""


class OutsideRunDirError(MeshprofError, OSError):
    """A path a rank was about to write leads outside the run directory (a symbolic link, or a
    name that is not one path component). An ``OSError`` too: a writer that stops writing on
    a full disk stops on this as well, without raising into training."""


def check_name(name: str) -> str:
    """``name`` if it is one path component (not empty, ``.``, ``..``, no separator, no NUL)."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\0" in name
        or (os.sep != "/" and os.sep in name)
        or (os.altsep is not None and os.altsep in name)
    ):
        raise OutsideRunDirError(f"{name!r}: not a file name (one path component)")
    return name


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(path))


def is_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bool:
    """``path``, every symbolic link resolved, is ``root`` or under it (``root`` resolved too:
    a run directory that is itself a link is fine)."""
    base, real = _real(root), _real(path)
    try:
        return os.path.commonpath([base, real]) == base
    except ValueError:  # (other drives on Windows)
        return False


def check_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """``path`` if it lies under ``root`` once every symbolic link is resolved;
    :class:`OutsideRunDirError` otherwise."""
    if not is_inside(root, path):
        raise OutsideRunDirError(
            f"{path}: leads outside the run directory {root} (to {_real(path)}): not written"
        )
    return Path(path)


def make_dirs(root: str | os.PathLike[str], folder: str | os.PathLike[str]) -> Path:
    """Create ``folder`` (and its parents below ``root``) and check it lies under ``root``,
    symbolic links resolved (:class:`OutsideRunDirError`)."""
    folder = Path(folder)
    check_inside(root, folder)  # (what exists: a planted link is not created through)
    folder.mkdir(parents=True, exist_ok=True)
    return check_inside(root, folder)


def open_dir(root: str | os.PathLike[str], parts: Sequence[str], create: bool = True) -> int:
    """A descriptor of the folder ``root/parts[0]/parts[1]/...``, each part opened without
    following a symbolic link (created when missing and ``create``). The caller closes it.
    :class:`OutsideRunDirError` for a part that is a link or not a folder; ``OSError`` for
    the rest (a missing folder when not ``create``, a full disk)."""
    names = [check_name(p) for p in parts]
    if not HAVE_DIR_FD:
        folder = Path(root, *names)
        (make_dirs(root, folder) if create else check_inside(root, folder))
        return os.open(folder, os.O_RDONLY | _CLOEXEC)
    fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)  # (the root itself may be a link)
    try:
        for name in names:
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                nxt = _open_child(fd, name)
            except OSError:
                nxt = _open_child(fd, name)  # (a link or a file: OutsideRunDirError)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_child(fd: int, name: str) -> int:
    """``name`` in the folder ``fd`` as a folder descriptor; a link or a file there is an
    :class:`OutsideRunDirError`."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            raise e from None
        import stat

        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise OutsideRunDirError(
            f"{name}: {what} where a folder of the run directory belongs"
        ) from None


@contextlib.contextmanager
def opened_dir(
    root: str | os.PathLike[str], parts: Sequence[str], create: bool = True
) -> Iterator[int]:
    """:func:`open_dir` as a context (the descriptor is closed at its end)."""
    fd = open_dir(root, parts, create)
    try:
        yield fd
    finally:
        os.close(fd)


def write_at(
    dir_fd: int, name: str, data: bytes, *, fsync: bool = False, replace: bool = True
) -> bool:
    """Write ``data`` as ``name`` in the folder ``dir_fd`` atomically: a new temporary file,
    then a rename over ``name`` (a symbolic link there is replaced, never followed).
    ``replace=False``: leave an existing ``name`` as it is (returns False then)."""
    check_name(name)
    if not replace and _exists_at(dir_fd, name):
        return False
    tmp = ""
    for _ in range(100):
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            tfd = os.open(tmp, _TMP_FLAGS, FILE_MODE, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name for {name}")
    try:
        with os.fdopen(tfd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if replace:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        else:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=dir_fd)
        return True
    except FileExistsError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        return False
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except OSError:
        return False


def fd_path(dir_fd: int) -> str | None:
    """A path that names the folder ``dir_fd`` itself, whatever renames happen
    (``/proc/self/fd/N`` on Linux; None where there is none)."""
    p = f"/proc/self/fd/{dir_fd}"
    return p if os.path.isdir(p) else None


def private_dir(dir_fd: int, prefix: str) -> tuple[int, str]:
    """A new folder only this user can write (mode 0700) inside the folder ``dir_fd``, for
    files that other code writes by path (torch.profiler's trace): (its descriptor, its
    name). Nobody else can plant a link in it, and its descriptor's path (:func:`fd_path`)
    names it whatever is renamed around it."""
    check_name(prefix)
    for _ in range(100):
        name = f".{prefix}.{secrets.token_hex(6)}"
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            continue
        return _open_child(dir_fd, name), name
    raise FileExistsError(f"no free name for a private folder {prefix}")


def remove_private_dir(dir_fd: int, fd: int, name: str) -> None:
    """Remove what :func:`private_dir` made (its files, then itself); never raises."""
    with contextlib.suppress(OSError):
        for f in os.listdir(fd):
            with contextlib.suppress(OSError):
                os.unlink(f, dir_fd=fd)
    with contextlib.suppress(OSError):
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=dir_fd)


def confined_write(
    root: str | os.PathLike[str],
    parts: Sequence[str],
    name: str,
    data: bytes,
    *,
    replace: bool = True,
) -> Path:
    """Write ``root/parts.../name`` atomically, inside ``root`` whatever links the folders hold
    (:func:`open_dir`, :func:`write_at`). Returns the path."""
    path = Path(root, *(check_name(p) for p in parts), check_name(name))
    if not HAVE_DIR_FD:  # (Windows: the path, checked)
        from meshprof.rundir.atomic import atomic_write_bytes

        make_dirs(root, path.parent)
        if replace or not path.exists():
            atomic_write_bytes(path, data, fsync=False)
        return path
    with opened_dir(root, parts) as fd:
        write_at(fd, name, data, replace=replace)
    return path


__all__ = [
    "HAVE_DIR_FD",
    "OutsideRunDirError",
    "check_inside",
    "check_name",
    "confined_write",
    "fd_path",
    "is_inside",
    "make_dirs",
    "open_dir",
    "opened_dir",
    "private_dir",
    "remove_private_dir",
    "write_at",
]
