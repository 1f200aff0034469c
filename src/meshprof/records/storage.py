"""How a rank's recording is stored: the header of each segment file, and the rank meta's
``storage`` record (what was written, rotated out or never written, and why writing stopped).

A rank appends what is new to segment files (:mod:`meshprof.rundir.segments`); these records are
the JSON parts of that format. Times are integers in ns since the epoch (``*_ns``); sizes in
bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshprof.records.json_record import JsonRecord
from meshprof.records.members import check_world

SEGMENT_FORMAT = "meshprof-segments/1"
"""The ``format`` of a segment file's header and of a rank meta's ``storage``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SegmentHeader(JsonRecord):
    """The first chunk of every segment file (JSON): whose rows follow, in which layout."""

    format: str | None = None
    """``"meshprof-segments/1"``."""
    rank: int | None = None
    """Global rank."""
    generation: int | None = None
    """The process that wrote it: 1 for the first, one more for each restart of the rank."""
    index: int | None = None
    """The segment's number in its generation (1, 2, ...; the steps file has 0)."""
    pid: int | None = None
    """The writing process."""
    run_id: str | None = None
    """The run's id (``meshprof run``; None for other writers)."""
    created_ns: int | None = None
    """When the file was created."""
    dtypes: dict[str, str] | None = None
    """Row layout of each table in the file, as ``numpy.dtype.descr`` text (``events``,
    ``spans``, ``memory``, ``batch``, ``steps``, and since serving requests are stored
    ``requests`` and ``tokens``): a reader refuses a file whose layout differs from its own."""

    def __post_init__(self) -> None:
        """The rank a file claims is checked when it is read (-1: unknown)."""
        check_world(self.rank, "segment header's rank")


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageInfo(JsonRecord):
    """A rank's storage at its last meta write (the rank meta's ``storage``)."""

    format: str | None = None
    """``"meshprof-segments/1"``."""
    generation: int | None = None
    """The process generation the meta belongs to (see :class:`SegmentHeader`)."""
    segments: int | None = None
    """Segment files created so far (rotated ones included)."""
    bytes_written: int | None = None
    """Bytes appended to segment and step files so far (the meta's own rewrites not included)."""
    meta_bytes_written: int | None = None
    """Bytes of the meta file's rewrites so far."""
    fsyncs: int | None = None
    """fsync calls so far."""
    events_written: int | None = None
    """Events appended so far (the recorder's ids 0 .. n-1, less ``ring_overrun``)."""
    steps_written: int | None = None
    """Per-step totals appended so far."""
    ring_overrun: int | None = None
    """Events the in-memory ring dropped before the writer could append them (more events
    between two ticks than the ring holds)."""
    rotated_segments: int | None = None
    """Segment files deleted by the retention bounds."""
    rotated_events: int | None = None
    """Events in those segments."""
    rotated_spans: int | None = None
    """Spans in those segments."""
    requests_written: int | None = None
    """Serving requests appended so far (finished ones, and at the last write those running)."""
    tokens_written: int | None = None
    """Token emissions of serving requests appended so far."""
    rotated_requests: int | None = None
    """Serving requests in the segments deleted by the retention bounds."""
    rotated_tokens: int | None = None
    """Token emissions in those segments."""
    retain_s: float | None = None
    """Segments whose newest row is older than this are deleted (0: no age bound)."""
    max_disk_bytes: int | None = None
    """The oldest segments are deleted while the rank's files take more than this (0: none)."""
    segment_bytes: int | None = None
    """A segment is closed and a new one begun at this size."""
    tick_s: float | None = None
    """Seconds between two appends: a process killed without warning loses at most this."""
    stopped: str | None = None
    """Why writing stopped for good: the error's name (``ENOSPC``, ``EDQUOT``, ``EROFS``,
    ``EIO``, ...); absent while it writes. Recording went on in memory only."""
    stopped_ns: int | None = None
    """When writing stopped."""
    stopped_step: int | None = None
    """The step the rank was in when writing stopped."""
    error: str | None = None
    """The error's text."""
    closed_ns: int | None = None
    """When the writer closed its files (the process ended or the session stopped); absent
    while it writes, and in the last meta of a process that died without warning."""


__all__ = ["SEGMENT_FORMAT", "SegmentHeader", "StorageInfo"]
