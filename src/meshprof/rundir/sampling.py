"""Loading a consistent sample of a run's collectives, and choosing its size.

A collective is kept when the recorder's hash of (group name, seq) falls below the fraction
(:meth:`meshprof.comm.recorder.CommProfiler.begin`: ``((seq · 2654435761) ^ crc32(name)) mod
2**32 < fraction · 2**32``). The hash is the same on every member rank, so every member's copy of
a kept collective is kept and matching across ranks still works; a run recorded with
``sample_rate`` r and loaded with fraction f holds the collectives whose hash is below min(r, f).
send/recv pairs are kept or left together too (their seq counts the messages of one pair and
direction on both sides).

The fraction is given (``meshprof report --sample F``) or chosen so that the report's estimated
peak memory fits a budget (``--max-memory``, default half of the available memory):
:func:`estimate_report_bytes`, :func:`choose_fraction`.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.rundir.schema import rank_entries

_HASH_MULT = 2654435761  # the recorder's multiplier (Knuth's multiplicative hash)
EVENT_FILE_BYTES = 54
"""Bytes per event in a rank file (EVENT_DTYPE rows; uncompressed)."""
REPORT_BYTES_PER_EVENT = 120
"""Peak memory of ``meshprof report`` per event loaded (bytes), measured with
``benchmarks/scale_report.py`` (70–110 B per event from 1M to 16M events; rounded up)."""
REPORT_BASE_BYTES = 150 << 20
"""Peak memory of ``meshprof report`` besides the events (interpreter, numpy, rank metadata)."""
MIN_FRACTION = 0.001


def threshold(fraction: float) -> int:
    """The hash threshold of a sample fraction in (0, 1] (as the recorder computes it)."""
    return int(fraction * 2**32)


def group_crcs(groups: Iterable[Any]) -> np.ndarray:
    """uint64 per group code of a rank file: CRC-32 of the group's name."""
    names = [str(g.get("name", "")) if isinstance(g, dict) else "" for g in groups]
    return np.asarray([zlib.crc32(n.encode()) for n in names] or [0], dtype=np.uint64)


def sampled(seq: np.ndarray, crc: np.ndarray, limit: int) -> np.ndarray:
    """bool per row: (seq, group crc) hashes below ``limit`` (:func:`threshold`). The product is
    taken modulo 2**64; its low 32 bits, the only ones the hash keeps, are exact."""
    h = seq.astype(np.uint64) * np.uint64(_HASH_MULT)
    h ^= crc
    h &= np.uint64(0xFFFFFFFF)
    return h < np.uint64(limit)


def events_on_disk(run_dir: str | Path | Iterable[str | Path]) -> int:
    """About how many events the run's ranks hold (from the sizes of their files and segments;
    no file is read), over one run directory or several."""
    dirs = [run_dir] if isinstance(run_dir, str | Path) else list(run_dir)
    total = 0
    for d in dirs:
        for _, path in rank_entries(d):
            try:
                files = path.iterdir() if path.is_dir() else [path]
                total += sum(f.stat().st_size for f in files) // EVENT_FILE_BYTES
            except OSError:
                continue
    return total


def estimate_report_bytes(events: int) -> int:
    """Estimated peak memory (bytes) of the report of a run of ``events`` events."""
    return REPORT_BASE_BYTES + REPORT_BYTES_PER_EVENT * max(events, 0)


def choose_fraction(events: int, budget_bytes: int) -> float:
    """The sample fraction (≤ 1, two significant digits, at least :data:`MIN_FRACTION`) whose
    estimated report memory fits ``budget_bytes``; 1.0 when the whole run fits."""
    if estimate_report_bytes(events) <= budget_bytes:
        return 1.0
    room = max(budget_bytes - REPORT_BASE_BYTES, 0)
    f = room / (REPORT_BYTES_PER_EVENT * max(events, 1))
    if f <= MIN_FRACTION:
        return MIN_FRACTION
    digits = 1 - int(np.floor(np.log10(f)))
    return max(float(np.floor(f * 10**digits) / 10**digits), MIN_FRACTION)


def default_budget() -> int:
    """Half of the memory available now (bytes)."""
    import psutil

    return int(psutil.virtual_memory().available // 2)


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``"2G"``, ``"512M"``, ``"1.5GiB"``, ``"1000000"`` → bytes (powers of 1024)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise MeshprofError(f"--max-memory {text!r}: expected a size such as 4G, 512M or 1.5GiB")
    scale = 1024 ** "_kmgt".index(m.group(2).lower() or "_")
    return int(float(m.group(1)) * scale)


def parse_fraction(text: str) -> float:
    """A sample fraction in (0, 1] from the command line."""
    try:
        f = float(text)
    except ValueError:
        f = float("nan")
    if not (0.0 < f <= 1.0):
        raise MeshprofError(f"--sample {text!r}: expected a fraction in (0, 1], e.g. 0.1")
    return f


__all__ = [
    "choose_fraction",
    "default_budget",
    "estimate_report_bytes",
    "events_on_disk",
    "group_crcs",
    "parse_bytes",
    "parse_fraction",
    "sampled",
    "threshold",
]
