"""Writing a capture's Kineto trace into ``RUN_DIR/captures/<id>/`` and nowhere else.

torch.profiler writes its trace by path, following whatever links the path holds; the capture's
folder is in a run directory that other users may write. So the trace is exported into a folder
only this user can write (mode 0700), made inside the capture's folder and named through its
descriptor (``/proc/self/fd/N``: renaming or replacing folders around it changes nothing),
compressed there, and renamed into the capture's folder through descriptors
(:mod:`meshprof.rundir.confine`)."""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshprof.rundir.atomic import FILE_MODE
from meshprof.rundir.captures import CAPTURES_DIR, captures_bytes, trace_name
from meshprof.rundir.confine import (
    HAVE_DIR_FD,
    check_inside,
    fd_path,
    make_dirs,
    opened_dir,
    private_dir,
    remove_private_dir,
)

_RAW = "trace.json"
_GZ = "trace.json.gz"
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


@dataclass(frozen=True, slots=True)
class WrittenTrace:
    """What :func:`write_trace` did."""

    name: str
    """The trace's file name in the capture's folder ("" when it was not kept)."""
    size: int
    """Its size (bytes; the size it would have had when not kept)."""


def write_trace(
    run_dir: str | os.PathLike[str], capture_id: str, rank: int, prof: Any, budget: int
) -> WrittenTrace:
    """Export ``prof``'s trace (``export_chrome_trace``) as rank ``rank``'s gzipped trace of
    capture ``capture_id``; not kept (name "") when the captures would then take more than
    ``budget`` bytes (0: no budget). ``OSError`` and the profiler's own errors propagate."""
    if not HAVE_DIR_FD:
        return _write_by_path(Path(run_dir), capture_id, rank, prof, budget)
    with opened_dir(run_dir, (CAPTURES_DIR, capture_id)) as cap_fd:
        fd, name = private_dir(cap_fd, f"rank{int(rank):05d}")
        try:
            base = fd_path(fd)
            if base is None:
                raise OSError("no /proc/self/fd to name the trace's folder by")
            _export(prof, os.path.join(base, _RAW), os.open(_GZ, _NEW, FILE_MODE, dir_fd=fd))
            os.unlink(_RAW, dir_fd=fd)
            size = os.stat(_GZ, dir_fd=fd).st_size
            if budget > 0 and captures_bytes(run_dir) > budget:
                return WrittenTrace("", size)
            final = trace_name(rank)
            os.rename(_GZ, final, src_dir_fd=fd, dst_dir_fd=cap_fd)
            return WrittenTrace(final, size)
        finally:
            remove_private_dir(cap_fd, fd, name)


def _export(prof: Any, raw: str, out_fd: int) -> None:
    """The profiler's trace as JSON at ``raw``, then gzipped into ``out_fd`` (closed)."""
    with os.fdopen(out_fd, "wb") as out:
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as fin, gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6) as fz:
            shutil.copyfileobj(fin, fz, 1 << 20)


def _write_by_path(
    run_dir: Path, capture_id: str, rank: int, prof: Any, budget: int
) -> WrittenTrace:
    """:func:`write_trace` where folders have no descriptors (Windows): by path, each one
    checked to lie in the run directory (:func:`~meshprof.rundir.confine.make_dirs`)."""
    import secrets

    folder = make_dirs(run_dir, run_dir / CAPTURES_DIR / capture_id)
    tag = secrets.token_hex(6)
    raw, gz = folder / f".{tag}.json", folder / f".{tag}.json.gz"
    try:
        _export(prof, str(raw), os.open(gz, _NEW, FILE_MODE))
        raw.unlink()
        size = gz.stat().st_size
        if budget > 0 and captures_bytes(run_dir) > budget:
            return WrittenTrace("", size)
        final = trace_name(rank)
        os.replace(gz, check_inside(run_dir, folder) / final)
        return WrittenTrace(final, size)
    finally:
        for f in (raw, gz):
            with contextlib.suppress(OSError):
                f.unlink()


__all__ = ["WrittenTrace", "write_trace"]
