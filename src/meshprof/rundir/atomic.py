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
def atomic_open(path: str | os.PathLike[str], mode: str = "wb", **kwargs: Any) -> Iterator[IO[Any]]:
    """A file to stream into (``mode`` "wb" or "w"; ``kwargs`` go to :func:`open`) that appears
    at ``path`` only when the block ends without an exception (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_open`). Returns the path."""
    with atomic_open(path, "wb") as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"))


__all__ = ["atomic_open", "atomic_write_bytes", "atomic_write_text"]
