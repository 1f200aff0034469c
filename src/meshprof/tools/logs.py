"""Per-rank logging: one rotating log file per rank, the rank in every record, console on rank 0.

``setup_logging(dir)`` configures the ``meshprof`` logger (or any logger by name) of this process.
It never raises into training: a log folder that cannot be created leaves console logging only.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path

from meshprof.process import process_rank

FORMAT = "%(asctime)s [rank %(rank)s] %(levelname)s %(name)s: %(message)s"


class RankFilter(logging.Filter):
    """Adds ``record.rank`` to every record that passes through a handler."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def log_file(log_dir: str | os.PathLike[str], rank: int) -> Path:
    """The path of ``rank``'s log file in ``log_dir``."""
    return Path(log_dir) / f"rank{rank:05d}.log"


def setup_logging(
    log_dir: str | os.PathLike[str] | None,
    *,
    rank: int | None = None,
    level: int | str = logging.INFO,
    logger: str = "meshprof",
    max_bytes: int = 10 * 1024 * 1024,
    backup_count: int = 3,
    console: bool = True,
) -> logging.Logger:
    """Log to ``log_dir/rankNNNNN.log`` (rotated at ``max_bytes``, ``backup_count`` old files kept)
    with ``[rank R]`` in every record; echo to stderr from rank 0 only.

    ``rank`` defaults to the process group's rank, else ``$RANK``, else 0. Calling it again
    replaces the handlers it installed before (no duplicated lines). Pass ``logger=""`` to
    configure the root logger (every library's records then go to the rank's file).
    """
    r = process_rank() if rank is None else int(rank)
    log = logging.getLogger(logger)
    log.setLevel(level)
    for h in list(log.handlers):
        if getattr(h, "_meshprof_handler", False):
            log.removeHandler(h)
            h.close()
    fmt = logging.Formatter(FORMAT)
    rank_filter = RankFilter(r)
    handlers: list[logging.Handler] = []
    if log_dir is not None:
        try:
            path = log_file(log_dir, r)
            path.parent.mkdir(parents=True, exist_ok=True)
            handlers.append(
                logging.handlers.RotatingFileHandler(
                    path, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8"
                )
            )
        except OSError as e:
            print(f"meshprof: cannot write logs to {log_dir}: {e}", file=sys.stderr)
    if console and r == 0:
        handlers.append(logging.StreamHandler(sys.stderr))
    for h in handlers:
        h.setFormatter(fmt)
        h.addFilter(rank_filter)
        h._meshprof_handler = True  # type: ignore[attr-defined]
        log.addHandler(h)
    if logger:
        log.propagate = False
    return log


__all__ = ["FORMAT", "RankFilter", "log_file", "setup_logging"]
