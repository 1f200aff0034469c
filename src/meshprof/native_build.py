"""Building meshprof's two compiled pieces once per host: the C++ recorder
(:mod:`meshprof.comm.native_ext`, through ``torch.utils.cpp_extension``) and the what-if replay's
level loop (:mod:`meshprof.analyze.run.replay.replay_native`, plain C through the system compiler).

Both follow one pattern, kept here: a build whose output's name encodes what it depends on (the
source's hash, the toolchain), looked up in a cache first; built under an exclusive host-wide
lock on a file beside it (``fcntl.flock``) so processes that start together build once and the
others wait, then find it; installed by an atomic rename or marked done by a stamp file, so a
half-written build is never loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path


def cache_dir() -> Path:
    """meshprof's own build cache: ``$MESHPROF_CACHE_DIR``, else ``$XDG_CACHE_HOME/meshprof``,
    else ``~/.cache/meshprof``."""
    env = os.environ.get("MESHPROF_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "meshprof"


def source_hash(*paths: Path, length: int = 16) -> str:
    """Hex digest of the files' bytes, in order (the part of a build's name that changes with
    its sources)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:length]


@contextlib.contextmanager
def host_lock(path: Path) -> Iterator[bool]:
    """Exclusive lock on ``path`` across the host's processes; yields whether another holder
    made this one wait (it may have built what was wanted). Without ``fcntl`` (not POSIX) it
    does not lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield False
        return
    with open(path, "a") as f:
        waited = False
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            waited = True
            fcntl.flock(f, fcntl.LOCK_EX)  # releases the GIL while it waits
        try:
            yield waited
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def c_compiler() -> str | None:
    """The system C compiler (``$CC``, Python's, ``cc``, ``gcc``), None when there is none."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    exe = str(cc).split()[0] if cc else "cc"
    return shutil.which(exe) or shutil.which("cc") or shutil.which("gcc")


def build_c_library(sources: Iterable[Path], target: Path, timeout_s: float = 120.0) -> bool:
    """Compile ``sources`` (plain C, no Python headers) into the shared library ``target``,
    once per host: under :func:`host_lock`, into a temporary file renamed into place. True when
    ``target`` exists afterwards; False without a compiler or when the compiler fails."""
    cc = c_compiler()
    if cc is None:
        return False
    with host_lock(target.with_suffix(".lock")):
        if target.exists():
            return True
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        cmd = [cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), *map(str, sources)]
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
        if proc.returncode != 0 or not tmp.exists():
            tmp.unlink(missing_ok=True)
            return False
        os.replace(tmp, target)
        return True
