"""Atomic file writes: a temporary file in the same folder, fsync, then a rename, so a crash
(or a reader racing the writer) never sees half a file.

Files get the mode :func:`open` gives: 0o666 less the umask (and a directory's default ACL), so
the other users of a group-writable shared run directory can read them (``tempfile.mkstemp``
would create them 0o600)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

FILE_MODE = 0o666
"""Mode meshprof creates its files with (the umask applies, as for :func:`open`)."""
_TMP_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temporary file next to ``path`` (a random name, created exclusively, as
    ``mkstemp`` does, but with :data:`FILE_MODE`): (its descriptor, its path)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, _TMP_FLAGS, FILE_MODE), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name next to {path}")


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "wb", *, fsync: bool = True, **kwargs: Any
) -> Iterator[IO[Any]]:
    """A file to stream into (``mode`` "wb" or "w"; ``kwargs`` go to :func:`open`) that appears
    at ``path`` only when the block ends without an exception (parent folders are created).
    ``fsync=False`` skips the flush to disk: readers still never see half a file, but a power
    loss may lose it (for files rewritten every second, such as the live state)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_open`). Returns the path."""
    with atomic_open(path, "wb", fsync=fsync) as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> Path:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


__all__ = ["FILE_MODE", "atomic_open", "atomic_write_bytes", "atomic_write_text"]
