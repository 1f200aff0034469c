"""One line of a long-running live helper's news (an exporter's warning, a watch's alert) for
a person: printed and flushed, never raising into the job when the stream is gone."""

from __future__ import annotations

import contextlib
import sys
from typing import TextIO


def say(line: str, stream: TextIO | None = None) -> None:
    """Print ``line`` to ``stream`` (stderr when None) and flush; a closed or broken stream
    (OSError, ValueError) loses the line and nothing else."""
    out = stream if stream is not None else sys.stderr
    with contextlib.suppress(OSError, ValueError):
        print(line, file=out, flush=True)


__all__ = ["say"]
