"""The live state of a running job (``RUN_DIR/live/``): the per-rank record each rank publishes
every second (:class:`RankLive`), the alerts (:class:`Alert`) and the snapshot the live views
read (:class:`LiveSnapshot`). Times are wall-clock ns (``time.time_ns``) of the writing host;
durations are ns. The files are read and written by :mod:`meshprof.rundir.live`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from meshprof.records.codec import CodedRecord, json_key
from meshprof.records.finding import Finding, Severity
from meshprof.records.members import check_world
from meshprof.records.serving import ServingLive

LIVE_FORMAT = "meshprof-live/1"

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


@dataclass(slots=True)
class InflightLive:
    """The oldest collective in flight on a rank."""

    op: str
    """The collective (``all_reduce``, ``send``, ...)."""
    group: str
    """Group description (e.g. "mesh_tp"), else its name."""
    dim: str
    """Parallel dimension of the group (dp, tp, pp, world, other)."""
    seq: int
    """Its sequence number in the group."""
    age_ns: int
    """How long it had been in flight when the record was written (``updated_ns`` − its issue
    time): a reader does not add the record's age (the collective may have completed since;
    a rank stuck in it publishes a newer record with a larger age, a rank that stopped
    publishing is ``stale``)."""
    issued_ns: int = 0
    """When it was issued (wall clock, ns; 0 in records of earlier versions)."""


@dataclass(slots=True)
class OpSeries:
    """Cumulative counters of one (op, dim) pair since the rank started recording."""

    op: str
    """The collective (``all_reduce``, ``send``, ...)."""
    dim: str
    """Parallel dimension of the group (dp, tp, pp, world, other)."""
    count: int = 0
    """Collectives completed."""
    sum_ns: int = 0
    """Sum of the collectives' durations (issue to completion), ns."""
    buckets: list[int] = field(default_factory=lambda: [0] * (len(HIST_BOUNDS_S) + 1))
    """Non-cumulative counts per :data:`HIST_BOUNDS_S` bucket, the last one is > the last bound."""


@dataclass(slots=True)
class DimLive:
    """Communication of one parallel dimension over the recent window."""

    dim: str
    """Parallel dimension of the group (dp, tp, pp, world, other)."""
    comm_ns: int
    """Sum of the dimension's collective durations in the window's steps, ns."""
    exposed_ns: int
    """The part of it the training thread was blocked on (not hidden by compute), ns."""
    comm_share: float
    """comm_ns / the window's step time."""
    exposed_share: float
    """exposed_ns / the window's step time."""


@dataclass(slots=True)
class RankLive(CodedRecord):
    """One rank's live state (``RUN_DIR/live/rank{R}.json``); ``to_dict`` / ``from_dict`` by the
    codec's rule (unknown keys ignored, missing ones take their defaults; a value of the wrong
    type raises :class:`~meshprof.records.codec.RecordError`)."""

    JSON_WHAT = "live record"

    rank: int
    """Global rank."""
    updated_ns: int
    """When this record was written (wall clock of the rank's host)."""
    interval_s: float
    """How often the rank publishes."""
    format: str = LIVE_FORMAT
    """``"meshprof-live/1"``."""
    world_size: int = -1
    """Ranks in the job (-1: unknown yet)."""
    pid: int = -1
    """The rank's process id."""
    hostname: str = ""
    """The rank's host."""
    node_id: str = ""
    """The launcher (node) the rank runs under."""
    stage: int = -1
    """Pipeline stage (the pp coordinate of the layout); live stragglers are looked for among
    the ranks of one stage. -1: no layout known (all ranks compared together)."""
    started_ns: int = 0
    """When the rank started recording."""
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
    """Communication per parallel dimension over the recent window."""
    memory_bytes: int = -1
    """Device memory allocated (CUDA) or the process RSS (CPU) at the last step end; -1: none."""
    memory_peak_bytes: int = -1
    """Peak device (CUDA) or resident (CPU) memory so far; -1: none."""
    memory_capacity_bytes: int = -1
    """Device (CUDA) or host (CPU) memory in total."""
    collectives: int = 0
    """Collectives completed since recording started."""
    inflight_count: int = 0
    """Collectives issued and not completed when the record was written (not yet in
    ``collectives`` or ``series``; each is counted there once it completes)."""
    inflight: InflightLive | None = None
    """The oldest collective in flight, None when none is."""
    series: list[OpSeries] = field(default_factory=list)
    """Cumulative counters and latency histogram per (op, dim)."""
    internal_errors: int = 0
    """Errors the publisher caught in itself (publishing went on)."""
    storage: str = ""
    """Why the rank stopped writing its files to the run directory ("writing stopped: ENOSPC
    (No space left on device)"); "" while it writes. Training and recording go on."""
    ledger_ns: dict[str, int] = field(default_factory=dict)
    """The rank's wall time since it started recording, by cause (a
    :class:`~meshprof.records.ledger.TimeCause` value, the report's time ledger's names),
    cumulative, ns; the parts sum to ``ledger_wall_ns`` exactly. ``straggler_wait`` is 0 here
    (one rank cannot see whom it waited for: the exporter carves it out across ranks). Empty
    before the first step."""
    ledger_wall_ns: int = 0
    """Wall time the ledger covers: from when the rank started recording (or its first step,
    when earlier) to the end of its last completed step (to the last record once ended), ns."""
    serving: ServingLive | None = None
    """A serving rank's live figures (requests, their latencies' histograms and recent
    percentiles, decode steps; :mod:`meshprof.records.serving`); None for a rank that serves
    no request and names no decode step."""

    def __post_init__(self) -> None:
        """The rank and world size a record claims are checked when it is read."""
        check_world(self.rank, "live.rank", low=0)
        check_world(self.world_size, "live.world_size")

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert(Finding, CodedRecord):
    """One alert raised by a live rule (kind: straggler, step_regression, throughput_drop,
    memory, memory_growth, inflight, stall, stale; severity warning or critical); ``title`` is
    written ``message`` in the JSON line of ``alerts.jsonl`` (``to_dict`` / ``from_dict``).
    Every rule gives ``value`` and ``threshold`` in one SI unit, named by ``unit``: a ratio
    (0.25 for 25 %), bytes or seconds."""

    JSON_WHAT = "alert"

    title: str = field(metadata=json_key("message"))
    """One line for people (its figures may be in ms, GiB or %; the fields are SI)."""
    severity: Severity = Severity.WARNING
    """``warning`` or ``critical``."""
    t_ns: int
    """When it was raised (wall clock)."""
    value: float = 0.0
    """The measured value that tripped the rule, in ``unit``: the excess compute over the
    other ranks' median (straggler), the step time's rise (step_regression) or the throughput's
    fall (throughput_drop) over the rank's baseline, as ratios; memory in use (memory) or its
    growth over the rank's baseline (memory_growth), bytes; how long the collective has been in
    flight (inflight), the step has lasted (stall) or the record is old (stale), seconds. For an
    alert naming several ranks, the worst rank's."""
    threshold: float = 0.0
    """The limit ``value`` crossed, in ``unit`` (the rule's option, or the noise band or the
    step-time multiple when that is larger)."""
    unit: str = ""
    """``ratio``, ``bytes`` or ``s``."""
    since_step: int = -1
    """The step at which the condition began (the earliest of the ranks named; for a stall, the
    step the rank is stuck in); -1 when no step is known."""

    @property
    def message(self) -> str:
        """One line for people (the title)."""
        return self.title


@dataclass(slots=True)
class LiveStraggler:
    """A rank that computes longer than the others over the recent window (the others wait)."""

    rank: int
    """Global rank."""
    compute_ns: int
    """Its median step time − exposed communication over the recent steps."""
    median_compute_ns: int
    """The median of that over the other fresh ranks."""
    excess_ns: int
    """compute_ns − median_compute_ns."""
    excess_ratio: float
    """excess_ns / median_compute_ns."""


@dataclass(slots=True)
class LiveSnapshot:
    """What a live view shows: every rank's record, the live stragglers and the alerts."""

    taken_ns: int
    """When the snapshot was read (wall clock)."""
    ranks: dict[int, RankLive]
    """Every rank's latest record, by rank."""
    stale: list[int]
    """Running ranks whose records stopped coming (see :meth:`RankLive.is_stale`)."""
    stragglers: list[LiveStraggler]
    """The live stragglers, largest excess first."""
    alerts: list[Alert]
    """The latest alerts, oldest first."""
    ended: bool
    """Every rank ended (or the run's manifest says the job finished)."""
    world_size: int
    """From the records (or the manifest); -1 when unknown."""
