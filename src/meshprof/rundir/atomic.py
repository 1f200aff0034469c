"""Atomic file writes: a temporary file in the same folder, fsync, then a rename, so a crash
(or a reader racing the writer) never sees half a file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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


__all__ = ["atomic_open", "atomic_write_bytes", "atomic_write_text"]
