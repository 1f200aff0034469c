"""Live state of a running job: the per-rank record each rank publishes every second, and the
snapshot that ``meshprof top``, ``meshprof serve``, the Prometheus exporter and the alert rules
read from a run directory.

Files (all in ``RUN_DIR/live/``, so a directory shared across nodes works):

* ``rank{R:05d}.json`` — one :class:`RankLive` per rank, replaced atomically by the rank every
  ``interval_s`` (``meshprof run --live-interval``, default 1 s). Small (a few KiB): the rank file
  is not rewritten for it.
* ``alerts.jsonl`` — one :class:`Alert` per line, appended by the launcher's alert rules.

Times are wall-clock ns (``time.time_ns``) of the writing host; durations are ns.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from meshprof.rundir.atomic import FILE_MODE, atomic_write_text

LIVE_FORMAT = "meshprof-live/1"
LIVE_DIR = "live"
ALERTS_FILE = "alerts.jsonl"
LIVE_FILE_RE = re.compile(r"^rank(\d+)\.json$")

#: A rank whose record is older than this many intervals (plus :data:`STALE_GRACE_S`) is stale.
STALE_INTERVALS = 3.0
STALE_GRACE_S = 2.0

#: Upper bounds (seconds) of the collective-latency histogram buckets (+Inf is implied).
HIST_BOUNDS_S: tuple[float, ...] = (
    1e-5,
    5e-5,
    1e-4,
    5e-4,
    1e-3,
    5e-3,
    1e-2,
    5e-2,
    0.1,
    0.5,
    1.0,
    5.0,
    30.0,
)


def live_dir(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/live``."""
    return Path(run_dir) / LIVE_DIR


def live_file(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` publishes its :class:`RankLive`."""
    return live_dir(run_dir) / f"rank{int(rank):05d}.json"


@dataclass(slots=True)
class InflightLive:
    """The oldest collective in flight on a rank."""

    op: str
    group: str
    """Group description (e.g. "mesh_tp"), else its name."""
    dim: str
    """Parallel dimension of the group (dp, tp, pp, world, other)."""
    seq: int
    age_ns: int
    """How long it has been in flight when the record was written."""


@dataclass(slots=True)
class OpSeries:
    """Cumulative counters of one (op, dim) pair since the rank started recording."""

    op: str
    dim: str
    count: int = 0
    sum_ns: int = 0
    """Sum of the collectives' durations (issue to completion), ns."""
    buckets: list[int] = field(default_factory=lambda: [0] * (len(HIST_BOUNDS_S) + 1))
    """Non-cumulative counts per :data:`HIST_BOUNDS_S` bucket, the last one is > the last bound."""


@dataclass(slots=True)
class DimLive:
    """Communication of one parallel dimension over the recent window."""

    dim: str
    comm_ns: int
    """Sum of the dimension's collective durations in the window's steps, ns."""
    exposed_ns: int
    """The part of it the training thread was blocked on (not hidden by compute), ns."""
    comm_share: float
    """comm_ns / the window's step time."""
    exposed_share: float
    """exposed_ns / the window's step time."""


@dataclass(slots=True)
class RankLive:
    """One rank's live state (``RUN_DIR/live/rank{R}.json``)."""

    rank: int
    updated_ns: int
    """When this record was written (wall clock of the rank's host)."""
    interval_s: float
    """How often the rank publishes."""
    format: str = LIVE_FORMAT
    world_size: int = -1
    pid: int = -1
    hostname: str = ""
    node_id: str = ""
    stage: int = -1
    """Pipeline stage (the pp coordinate of the layout); live stragglers are looked for among
    the ranks of one stage. -1: no layout known (all ranks compared together)."""
    started_ns: int = 0
    status: str = "running"
    """"running", or "ended" once the rank wrote its last record (see ``exit_how``)."""
    exit_how: str = ""
    """How the process ended ("normal", "exception", "signal", "exit"); "" while running."""
    step: int = -1
    """Number of the step in progress (or the next one)."""
    steps_done: int = 0
    """Steps completed so far."""
    recent_step_ns: list[int] = field(default_factory=list)
    """Durations of the most recent steps, oldest first (at most 32)."""
    step_ns: int = 0
    """Median of ``recent_step_ns`` (0 before the first step)."""
    last_step_end_ns: int = 0
    """When the last completed step ended (wall clock of the rank's host; 0 before the first
    step): the record's ``updated_ns`` minus this is how long the rank has been in its step."""
    compute_ns: int = 0
    """Median over the recent steps of step time − exposed communication."""
    steps_per_s: float = 0.0
    """Completed steps per second over the recent window (requests per second when each step
    is a request)."""
    tokens_per_s: float = 0.0
    """Tokens per second over the recent window (0 when steps carry no token counts)."""
    comm_share: float = 0.0
    """Communication time / step time over the recent window."""
    exposed_share: float = 0.0
    """Exposed communication / step time over the recent window."""
    dims: list[DimLive] = field(default_factory=list)
    memory_bytes: int = -1
    """Device memory allocated (CUDA) or the process RSS (CPU) at the last step end; -1: none."""
    memory_peak_bytes: int = -1
    memory_capacity_bytes: int = -1
    """Device (CUDA) or host (CPU) memory in total."""
    collectives: int = 0
    """Collectives completed since recording started."""
    inflight: InflightLive | None = None
    """The oldest collective in flight, None when none is."""
    series: list[OpSeries] = field(default_factory=list)
    """Cumulative counters and latency histogram per (op, dim)."""
    internal_errors: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON record."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankLive:
        """Tolerant of unknown and missing keys (older/newer writers)."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["dims"] = [DimLive(**_known(DimLive, x)) for x in d.get("dims") or []]
        kw["series"] = [OpSeries(**_known(OpSeries, x)) for x in d.get("series") or []]
        inf = d.get("inflight")
        kw["inflight"] = (
            InflightLive(**_known(InflightLive, inf)) if isinstance(inf, dict) else None
        )
        return cls(**kw)

    @property
    def age_ns(self) -> int:
        """How old this record is now."""
        return max(time.time_ns() - self.updated_ns, 0)

    def is_stale(self, now_ns: int | None = None) -> bool:
        """A running rank whose record is older than :data:`STALE_INTERVALS` intervals plus
        :data:`STALE_GRACE_S` (it died, hangs with the GIL held, or its node is gone)."""
        if self.status != "running":
            return False
        now = time.time_ns() if now_ns is None else now_ns
        limit = (STALE_INTERVALS * max(self.interval_s, 0.0) + STALE_GRACE_S) * 1e9
        return now - self.updated_ns > limit


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def write_rank_live(run_dir: str | os.PathLike[str], rec: RankLive) -> Path:
    """Publish ``rec`` atomically (a new file renamed into place; :class:`LiveWriter` is the
    cheaper way for a rank that publishes every second)."""
    return atomic_write_text(live_file(run_dir, rec.rank), json.dumps(rec.to_dict()), fsync=False)


class LiveWriter:
    """Rewrites one rank's live file in place (``pwrite`` at offset 0, then truncate), keeping
    the file open.

    Why not a rename per record: on ext4 replacing an existing file by rename forces the new
    data to disk first (``auto_da_alloc``), ~5 ms each time here; an in-place write is ~40 µs.
    A reader that races the write may see a mix of two records, which is not valid JSON:
    :func:`read_rank_lives` reads again."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)

    def write(self, rec: RankLive) -> Path:
        data = json.dumps(rec.to_dict()).encode("utf-8")
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        return self.path

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _read_record(p: Path, tries: int = 3) -> RankLive | None:
    for i in range(tries):
        try:
            data = json.loads(p.read_text("utf-8"))
            return RankLive.from_dict(data) if isinstance(data, dict) else None
        except (ValueError, UnicodeDecodeError):
            if i + 1 < tries:
                time.sleep(0.005)  # raced the writer: read again
        except (OSError, TypeError):
            return None
    return None


def read_rank_lives(
    run_dir: str | os.PathLike[str], only: Callable[[int], bool] | None = None
) -> dict[int, RankLive]:
    """Every rank's latest record (files that cannot be read are skipped: a reader may race a
    rank's first write). ``only``: read just the ranks it accepts (by rank number, before the
    file is opened)."""
    out: dict[int, RankLive] = {}
    d = live_dir(run_dir)
    if not d.is_dir():
        return out
    for p in d.iterdir():
        m = LIVE_FILE_RE.match(p.name)
        if not m or (only is not None and not only(int(m.group(1)))):
            continue
        rec = _read_record(p)
        if rec is not None:
            out[int(m.group(1))] = rec
    return dict(sorted(out.items()))


def clear_live(run_dir: str | os.PathLike[str]) -> int:
    """Remove a previous run's live records and alerts from ``run_dir`` (a run directory used
    again); the number of files removed. The launcher calls it before the workers start."""
    d = live_dir(run_dir)
    removed = 0
    if not d.is_dir():
        return 0
    for p in d.iterdir():
        if LIVE_FILE_RE.match(p.name) or p.name == ALERTS_FILE:
            with contextlib.suppress(OSError):
                p.unlink()
                removed += 1
    return removed


# -- alerts ------------------------------------------------------------------------------------
@dataclass(slots=True)
class Alert:
    """One alert raised by a live rule."""

    kind: str
    """Rule: "straggler", "step_regression", "memory", "inflight", "throughput_drop", ..."""
    message: str
    """One line for people."""
    t_ns: int
    """When it was raised (wall clock)."""
    ranks: list[int] = field(default_factory=list)
    severity: str = "warning"
    """"warning" or "critical"."""
    value: float | None = None
    """The measured value that tripped the rule (its unit depends on the rule)."""
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Alert:
        return cls(**_known(cls, d))


def append_alert(run_dir: str | os.PathLike[str], alert: Alert) -> None:
    """Append ``alert`` to ``RUN_DIR/live/alerts.jsonl`` (one short write: lines of several
    writers do not interleave)."""
    path = live_dir(run_dir) / ALERTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(alert.to_dict()) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_alerts(run_dir: str | os.PathLike[str], last: int = 100) -> list[Alert]:
    """The ``last`` alerts, oldest first (lines that do not parse are skipped)."""
    path = live_dir(run_dir) / ALERTS_FILE
    out: list[Alert] = []
    with contextlib.suppress(OSError):
        for line in path.read_text("utf-8").splitlines()[-last:]:
            with contextlib.suppress(ValueError, TypeError):
                d = json.loads(line)
                if isinstance(d, dict):
                    out.append(Alert.from_dict(d))
    return out


# -- snapshot ----------------------------------------------------------------------------------
@dataclass(slots=True)
class LiveStraggler:
    """A rank that computes longer than the others over the recent window (the others wait)."""

    rank: int
    compute_ns: int
    """Its median step time − exposed communication over the recent steps."""
    median_compute_ns: int
    """The median of that over the other fresh ranks."""
    excess_ns: int
    excess_ratio: float
    """excess_ns / median_compute_ns."""


@dataclass(slots=True)
class LiveSnapshot:
    """What a live view shows: every rank's record, the live stragglers and the alerts."""

    taken_ns: int
    ranks: dict[int, RankLive]
    stale: list[int]
    """Running ranks whose records stopped coming (see :meth:`RankLive.is_stale`)."""
    stragglers: list[LiveStraggler]
    alerts: list[Alert]
    ended: bool
    """Every rank ended (or the run's manifest says the job finished)."""
    world_size: int
    """From the records (or the manifest); -1 when unknown."""


def find_stragglers(
    ranks: dict[int, RankLive], stale: list[int], min_ratio: float = 0.10, min_ns: int = 100_000
) -> list[LiveStraggler]:
    """Ranks whose recent compute time (step − exposed communication) exceeds the median of the
    *other* fresh ranks of the same pipeline stage (:attr:`RankLive.stage`: stages do different
    work, so the last stage's loss is no straggler) by more than ``min_ratio`` and ``min_ns``;
    largest excess first. (Against the others, not all ranks: with two ranks the median of both
    would halve the excess.)"""
    by_stage: dict[int, list[tuple[int, int]]] = {}
    for r, x in ranks.items():
        if r not in stale and x.compute_ns > 0:
            by_stage.setdefault(x.stage, []).append((x.compute_ns, r))
    out: list[LiveStraggler] = []
    for fresh in by_stage.values():
        out += _stragglers_among(sorted(fresh), min_ratio, min_ns)
    return sorted(out, key=lambda s: -s.excess_ns)


def _stragglers_among(
    fresh: list[tuple[int, int]], min_ratio: float, min_ns: int
) -> list[LiveStraggler]:
    """:func:`find_stragglers` within one set of comparable ranks, ``fresh`` = sorted
    (compute_ns, rank) pairs."""
    n = len(fresh)
    if n < 2:
        return []
    v = [c for c, _ in fresh]
    out = []
    for p, (c, r) in enumerate(fresh):
        m = n - 1

        def w(k: int, p: int = p) -> int:
            return v[k] if k < p else v[k + 1]

        med = w(m // 2) if m % 2 else (w(m // 2 - 1) + w(m // 2)) // 2
        excess = c - med
        if med > 0 and excess > min_ns and excess / med > min_ratio:
            out.append(LiveStraggler(r, c, med, excess, excess / med))
    return out


def read_snapshot(run_dir: str | os.PathLike[str], now_ns: int | None = None) -> LiveSnapshot:
    """Read a run directory's live state. Raises :class:`FileNotFoundError` when ``run_dir`` is
    not a directory (the commands turn that into their one-line error)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run} is not a directory")
    now = time.time_ns() if now_ns is None else now_ns
    ranks = read_rank_lives(run)
    stale = [r for r, x in ranks.items() if x.is_stale(now)]
    job_done = _manifest_done(run)
    ended = bool(ranks) and (job_done or all(x.status != "running" for x in ranks.values()))
    if job_done:
        stale = []  # the job is over: nobody is expected to publish
    world = max((x.world_size for x in ranks.values()), default=-1)
    return LiveSnapshot(
        taken_ns=now,
        ranks=ranks,
        stale=stale,
        stragglers=find_stragglers(ranks, stale),
        alerts=read_alerts(run),
        ended=ended,
        world_size=world,
    )


def manifest_done(run: str | os.PathLike[str]) -> bool:
    """The launcher wrote a final status (ok, failed, hang) into the run's manifest."""
    return _manifest_done(Path(run))


def _manifest_done(run: Path) -> bool:
    """The launcher wrote a final status (ok, failed, hang) into the manifest."""
    with contextlib.suppress(OSError, ValueError):
        m = json.loads((run / "manifest.json").read_text("utf-8"))
        return isinstance(m, dict) and m.get("status") in {"ok", "failed", "hang"}
    return False


def snapshot_to_dict(s: LiveSnapshot) -> dict[str, Any]:
    """The ``meshprof top --json`` shape: ``{"taken_ns", "ended", "world_size", "ranks": [...],
    "stale", "stragglers", "alerts"}``; each rank entry has ``rank, step, step_ns,
    tokens_per_s, comm_share, memory_bytes, inflight, updated_ns`` and the rest of its record."""
    ranks = []
    for r, x in s.ranks.items():
        d = x.to_dict()
        d.pop("series", None)
        d["stale"] = r in s.stale
        ranks.append(d)
    return {
        "taken_ns": s.taken_ns,
        "ended": s.ended,
        "world_size": s.world_size,
        "ranks": ranks,
        "stale": list(s.stale),
        "stragglers": [asdict(x) for x in s.stragglers],
        "alerts": [a.to_dict() for a in s.alerts],
    }


__all__ = [
    "ALERTS_FILE",
    "HIST_BOUNDS_S",
    "LIVE_DIR",
    "LIVE_FORMAT",
    "Alert",
    "DimLive",
    "InflightLive",
    "LiveSnapshot",
    "LiveStraggler",
    "LiveWriter",
    "OpSeries",
    "RankLive",
    "append_alert",
    "clear_live",
    "find_stragglers",
    "live_dir",
    "live_file",
    "manifest_done",
    "read_alerts",
    "read_rank_lives",
    "read_snapshot",
    "snapshot_to_dict",
    "write_rank_live",
]
