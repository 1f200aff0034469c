"""What ranks recorded but did not store, in words (:func:`storage_notes`): the report's
account of data lost to a full disk, to the retention bounds, or to a ring that overflowed
between two ticks. Read from each rank meta's ``storage`` record and the rows found on disk."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshprof.rundir.rankfile import RankData


@dataclass(frozen=True, slots=True)
class StorageNote:
    """One rank's data that was recorded but is not in the run directory."""

    rank: int
    """Global rank."""
    stopped: str
    """Why writing stopped for good (``ENOSPC (No space left on device)``); "" when it did not
    (rotation or an overflowing ring only)."""
    stopped_step: int | None
    """The step the rank was in when writing stopped."""
    missing_events: int
    """Events recorded but not in the run directory (their statistics are in the meta)."""
    rotated_events: int
    """Of them, rotated out by the retention bounds."""
    overrun_events: int
    """Of them, dropped by the in-memory ring before a tick could write them."""
    title: str
    """The note in one line."""


def _when(ns: int | None) -> str:
    if not ns:
        return ""
    return " at " + _dt.datetime.fromtimestamp(ns / 1e9).astimezone().strftime("%H:%M:%S")


def storage_notes(ranks: Mapping[int, RankData]) -> tuple[StorageNote, ...]:
    """A note per rank whose storage lost something, by rank (none for rank files of older
    versions, which keep no such record)."""
    out: list[StorageNote] = []
    for r, rd in sorted(ranks.items()):
        st = rd.meta.storage
        if st is None:
            continue
        total = int(rd.meta.total_events or 0)
        missing = max(0, total - rd.file_events) if rd.file_events >= 0 else 0
        rotated = int(st.rotated_events or 0)
        overrun = int(st.ring_overrun or 0)
        stopped = ""
        if st.stopped:
            stopped = f"{st.stopped} ({st.error})" if st.error else st.stopped
        if not (stopped or rotated or overrun):
            continue
        parts: list[str] = []
        if stopped:
            step = f" in step {st.stopped_step}" if st.stopped_step is not None else ""
            parts.append(
                f"writing stopped{_when(st.stopped_ns)}{step}: {stopped}; "
                f"{max(missing - rotated - overrun, 0):,} of its {total:,} events and what "
                "followed are not on disk (its statistics cover them all)"
            )
        if rotated:
            parts.append(
                f"{rotated:,} older events were rotated out by the retention bounds "
                "(its per-step totals cover the whole run)"
            )
        if overrun:
            parts.append(f"{overrun:,} events left the in-memory ring before they were written")
        out.append(
            StorageNote(
                rank=r,
                stopped=stopped,
                stopped_step=st.stopped_step,
                missing_events=missing,
                rotated_events=rotated,
                overrun_events=overrun,
                title=f"rank {r}: " + "; ".join(parts),
            )
        )
    return tuple(out)


__all__ = ["StorageNote", "storage_notes"]
