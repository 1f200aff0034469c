"""Reading a small JSON file that anyone who can write the run directory may have written: a
regular file (not a FIFO that would block the reader, not a device), of a bounded size (a
manifest claiming to be 10 GB is not read into memory), parsed with its nesting depth bounded
(``[[[[...`` a million deep is an error, not a crash). Every failure is an ``OSError`` or a
``ValueError``, which the callers already treat as a damaged file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 << 20
"""The largest JSON file read by default (bytes): a manifest of 100,000 ranks is ~10 MB."""


class TooLargeError(OSError):
    """A file larger than the reader's bound."""


def read_bytes(
    path: str | os.PathLike[str], max_bytes: int | None = MAX_JSON_BYTES, *, follow: bool = True
) -> bytes:
    """The bytes of ``path``: a regular file of at most ``max_bytes`` (``OSError`` otherwise;
    :class:`TooLargeError` when larger; None: any size, what the disk holds).
    ``follow=False``: a symbolic link is refused too."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(Path(path), flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        if max_bytes is None:
            max_bytes = st.st_size  # (a regular file: what it holds now)
        elif st.st_size > max_bytes:
            raise TooLargeError(f"{path}: {st.st_size:,} bytes, more than the {max_bytes:,} read")
        chunks = []
        left = max_bytes + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)[:max_bytes]  # (a file that grew while read: what it held)
    finally:
        os.close(fd)


def is_regular(path: str | os.PathLike[str]) -> bool:
    """``path`` is (or links to) a regular file: not a FIFO, a device, a folder."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def loads(text: str | bytes) -> Any:
    """``json.loads``, with a nesting too deep for the parser a ``ValueError``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


def read_json(
    path: str | os.PathLike[str], max_bytes: int | None = MAX_JSON_BYTES, *, follow: bool = True
) -> Any:
    """The JSON value in ``path`` (:func:`read_bytes`, UTF-8, :func:`loads`)."""
    return loads(read_bytes(path, max_bytes, follow=follow).decode("utf-8"))


__all__ = [
    "MAX_JSON_BYTES",
    "TooLargeError",
    "is_regular",
    "loads",
    "read_bytes",
    "read_json",
]
