"""A rank file's ``meta``: who recorded, the tables that name the event columns' codes, exact
statistics, and what the launcher and bootstrap added; every nested object a typed record.

Times are integers in ns since the epoch (``*_ns``) unless a name says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshprof.records.codec import RecordError, json_key
from meshprof.records.json_record import JsonRecord
from meshprof.records.members import Members, check_world
from meshprof.records.storage import StorageInfo

RANK_FORMAT = "meshprof-rank/1"
"""The ``format`` of a rank file's meta."""


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a rank's process ended (the rank writer records it)."""

    how: str
    """"normal", "exit" (SystemExit with a non-zero code), "exception" or "signal"."""
    code: int | None = None
    """The process exit status (128 + signal number for a signal)."""
    error: str = ""
    """The exception's one-line text, or the signal's name."""
    t_ns: int = 0
    """When it was recorded (wall clock, ns)."""

    def to_dict(self) -> dict[str, Any]:
        return {"how": self.how, "code": self.code, "error": self.error, "t_ns": self.t_ns}

    @classmethod
    def from_json_data(cls, d: Any, where: str) -> ExitStatus:
        """The codec's hook: tolerant of older writers' keys."""
        if not isinstance(d, dict):
            raise RecordError(f"{where}: expected an object, got {d!r:.40}")
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExitStatus:
        return cls(
            how=str(d.get("how", "")),
            code=d.get("code"),
            error=str(d.get("error", "")),
            t_ns=int(d.get("t_ns") or 0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Handover(JsonRecord):
    """The Python kernel's handover to the native one during the run."""

    from_kernel: str | None = field(default=None, metadata=json_key("from"))
    """The kernel recording first (``"python"``)."""
    to: str | None = None
    """The kernel it handed over to (``"native"``; absent: no handover happened)."""
    at_ns: int | None = None
    """When (wall clock, ns)."""
    error: str | None = None
    """Why the native kernel could not be built (the Python kernel kept recording)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecorderInfo(JsonRecord):
    """Which dispatcher kernel recorded."""

    kernel: str | None = None
    """``"python"`` or ``"native"``: the last one installed."""
    handover: Handover | None = None
    """Set when the Python kernel handed over to the native one (or tried to)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecorderCpu(JsonRecord):
    """CPU used by meshprof's own threads of a process so far."""

    threads_ns: dict[str, int] | None = None
    """CPU time by thread name (ns)."""
    total_ns: int | None = None
    """Their sum (ns)."""
    collectives: int | None = None
    """Collectives recorded so far."""
    per_collective_ns: float | None = None
    """total_ns / collectives (ns); None before the first."""
    per_second_ms: float | None = None
    """CPU ms per wall-clock second since recording began (thousandths of a core)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRecord(JsonRecord):
    """A process group as the recorder knew it."""

    name: str | None = None
    """The group's name (``"0"`` for the default group)."""
    desc: str | None = None
    """Its description (``"default_pg"``, ``"mesh_tp"``, ...)."""
    ranks: Members | None = None
    """Global ranks of its members, in group-rank order: ``{"start", "stop", "step"}`` (a
    progression, ``stop`` exclusive: the world group, a DeviceMesh dimension's groups) or the
    list of them (an irregular group; every group in files of earlier versions). Read as
    :class:`~meshprof.records.members.Members`, a sequence of ints never expanded unless
    iterated; a list given in code is made one."""
    backend: str | None = None
    """``"nccl"``, ``"gloo"``, ..."""
    mesh_dims: list[str] | None = None
    """The DeviceMesh dimension names the job gave this group, as it spelled them (``["tp"]``;
    ``["tp", "efsdp"]`` for a world group two meshes reuse); None when no mesh of the job
    names it. They say the group's parallel dimension (:func:`meshprof.layout.dimension_of`)
    unless the user gave a layout."""

    def __post_init__(self) -> None:
        if self.ranks is not None and not isinstance(self.ranks, Members):
            object.__setattr__(self, "ranks", Members.of(self.ranks))


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorSettings(JsonRecord):
    """The step monitor's settings, for the report's per-rank step analysis."""

    layout: dict[str, int] | None = None
    """The dp/tp/pp layout the monitor was given."""
    schedule: str | None = None
    """The pipeline schedule's name ("" without pipelining)."""
    microbatches: int | None = None
    """Micro-batches per step (pipelining)."""
    virtual_stages: int | None = None
    """Virtual stages per rank (interleaved schedules)."""
    flops_per_step: float | None = None
    """FLOPs of one step on this rank (for MFU); None when unknown."""
    peak_tflops: float | None = None
    """The device's peak TFLOP/s; None when unknown."""
    warmup_steps: int | None = None
    """Steps left out of the averages at the start."""
    instrumented_steps: list[int] | None = None
    """Steps meshprof itself slowed (``@performance_monitor``'s FLOP-counter, memory-snapshot
    and torch.profiler steps, a capture's traced steps), left out of the averages."""
    thresholds: dict[str, float] | None = None
    """The bottleneck rules' thresholds (``BottleneckThresholds``)."""
    span_names: list[str] | None = None
    """Names of the spans' ``name`` codes."""
    monitor_internal_errors: int | None = None
    """Errors the monitor caught in itself (recording went on)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingCounters(JsonRecord):
    """The request monitor's counts at this write (a serving rank,
    :class:`~meshprof.monitor.request_monitor.RequestMonitor`)."""

    requests_begun: int | None = None
    """Requests begun since the process started."""
    requests_finished: int | None = None
    """Requests finished since then (every reason)."""
    prompt_tokens: int | None = None
    """Prompt tokens of the requests begun."""
    output_tokens: int | None = None
    """Output tokens emitted."""
    requests_forgotten: int | None = None
    """Requests dropped unfinished: more in flight at once than the monitor tracks."""
    unknown_calls: int | None = None
    """Calls about a request the monitor did not track (ignored)."""
    traceparents: int | None = None
    """Requests begun with a ``traceparent`` (valid or not)."""
    invalid_traceparents: int | None = None
    """Of those written so far, the ``traceparent`` values that were not valid ones (ignored:
    those requests start traces of their own)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WriterCounters(JsonRecord):
    """The rank writer's counters at this write."""

    writes: int | None = None
    """Rank files written so far, this one included."""
    interval_s: float | None = None
    """Seconds between two periodic writes."""
    failures: int | None = None
    """Writes that failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Target(JsonRecord):
    """What ``meshprof run`` ran."""

    kind: str | None = None
    """``"script"`` or ``"module"``."""
    name: str | None = None
    """The script's path or the module's name."""
    args: list[str] | None = None
    """Its arguments."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockSync(JsonRecord):
    """The timestamp exchange at start (``meshprof.comm.clocksync``)."""

    method: str | None = None
    """``"pg"``: over the default process group."""
    ref_rank: int | None = None
    """The reference rank."""
    rank: int | None = None
    """This rank."""
    rounds: int | None = None
    """Exchanges made."""
    samples: list[list[int]] | None = None
    """(t_send, t_ref, t_recv) per round: this rank's clock at send and receive, the reference's
    in between (ns)."""
    error: str | None = None
    """Why the exchange failed ("" when it did not)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovered(JsonRecord):
    """Where a dead rank's data was recovered from."""

    from_dir: str | None = field(default=None, metadata=json_key("from"))
    """``"segments"`` (the rank's last tick), or ``"crashsafe"`` (older versions' mapped
    files)."""
    tick_ns: int | None = None
    """Wall clock of the last tick: the data is complete up to it."""
    step: int | None = None
    """The step the rank was in."""
    step_ns: int | None = None
    """When that step began."""
    pid: int | None = None
    """The process."""
    ticks: int | None = None
    """Ticks written."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMeta(JsonRecord):
    """A rank file's ``meta`` (JSON): who recorded, the tables that name the event columns'
    codes, exact statistics, and what the launcher/bootstrap added. Every field is optional
    (None: absent); :class:`meshprof.rundir.rankfile.RankData` gives defaults."""

    format: str | None = None
    """``"meshprof-rank/1"``."""
    meshprof_version: str | None = None
    """The meshprof that wrote the file."""
    torch_version: str | None = None
    """The torch the rank ran."""
    rank: int | None = None
    """Global rank."""
    world_size: int | None = None
    """Ranks in the job, as the rank saw it."""
    hostname: str | None = None
    """The rank's host."""
    pid: int | None = None
    """The rank's process id."""
    created_ns: int | None = None
    """When the recorder was created."""
    exported_ns: int | None = None
    """When this meta was assembled (the write)."""
    total_events: int | None = None
    """Events recorded since start (retained + evicted)."""
    retained_events: int | None = None
    """Events in the file (the ring buffer's content)."""
    evicted_events: int | None = None
    """Events the ring buffer dropped to make room (their statistics are kept)."""
    inflight_events: int | None = None
    """Collectives issued and not completed at this write: the rank file's ``inflight`` rows
    (an export's events of status ``pending``), not counted in ``total_events``."""
    dropped_events: int | None = None
    """Events not recorded at all (sampling, the ops filter, errors)."""
    recorder: RecorderInfo | None = None
    """Which dispatcher kernel recorded, and the handover from Python to native if any."""
    recorder_cpu: RecorderCpu | None = None
    """CPU of meshprof's own threads at this write (``CommProfiler.recorder_cpu``)."""
    internal_errors: int | None = None
    """Errors the recorder caught in itself (recording went on)."""
    first_internal_error: str | None = None
    """The first of them, as text."""
    groups: list[GroupRecord] | None = None
    """The process groups, indexed by the events' ``group`` code."""
    config: dict[str, Any] | None = None
    """The recorder's ``ProfilerConfig.to_dict()`` (its fields are documented on
    :class:`meshprof.config.ProfilerConfig`; kept as an object so a file from a version with other
    settings still reads)."""
    dtypes: list[str] | None = None
    """Names of the events' ``dtype`` codes."""
    labels: list[str] | None = None
    """Custom op labels; op code CUSTOM_BASE + i names labels[i]."""
    errors: dict[str, str] | None = None
    """Error text by event row index (as a string)."""
    metadata: dict[str, Any] | None = None
    """User metadata by event row index (as a string): whatever the user attached (free form)."""
    stats: dict[str, Any] | None = None
    """Exact statistics over every event, evicted ones included: the statistics module's own
    format (``meshprof.stats.Accumulator.to_dict``, read back by ``Accumulator.from_dict``)."""
    first_event_id: int | None = None
    """Recorder id of the first row of ``events``."""
    span_names: list[str] | None = None
    """Names of the spans' ``name`` codes."""
    monitor: MonitorSettings | None = None
    """The step monitor's settings (``StepMonitor.to_meta``)."""
    writer: WriterCounters | None = None
    """The rank writer's counters."""
    exit: ExitStatus | None = None
    """How the process ended (absent while it runs)."""
    target: Target | None = None
    """``meshprof run``: the script or module."""
    local_rank: int | None = None
    """The rank on its node (torchrun's LOCAL_RANK)."""
    node_rank: int | None = None
    """Its node's rank (torchrun's GROUP_RANK)."""
    node_id: str | None = None
    """The launcher (node) this rank ran under."""
    torchrun_restart: int | None = None
    """torchrun's restart count (TORCHELASTIC_RESTART_COUNT)."""
    bootstrap_start_ns: int | None = None
    """When ``meshprof run``'s bootstrap started in this worker."""
    layout: dict[str, int] | None = None
    """The dp/tp/pp layout as given (read it through :func:`resolve_layout`)."""
    layout_assumed: bool | None = None
    """True when no layout was given and pure data parallelism was assumed."""
    step_detection: str | None = None
    """"optimizer" when steps were detected automatically."""
    steps_detected: int | None = None
    """Steps made by automatic step detection."""
    hang_timeout_s: float | None = None
    """The watchdog's timeout (s; 0: no watchdog)."""
    backend: str | None = None
    """The default process group's backend."""
    device: str | None = None
    """What the rank computed on: ``"cuda"`` once the process initialized CUDA, ``"xpu"`` the
    same for Intel GPUs, else ``"cpu"`` (None in files of earlier versions: the backend then
    tells, see :func:`meshprof.rundir.device_kind`)."""
    clock_sync: ClockSync | None = None
    """Timestamp exchange at start (``meshprof.comm.clocksync.exchange_timestamps``)."""
    current_step: int | None = None
    """The step the rank was in at this write (the recorder's step; -1 before the first)."""
    recovered: Recovered | None = None
    """Set when this data was recovered from the crash-safe files of a rank that died without
    writing its final rank file: from the crash-safe files of older versions, or from the
    segments' last tick (:mod:`meshprof.rundir.segments`)."""
    run_id: str | None = None
    """The run's id (``meshprof run``: agreed by the launchers of the job)."""
    storage: StorageInfo | None = None
    """How the rank's recording was stored (segment files): written, rotated out, and why
    writing stopped if it did."""
    serving: ServingCounters | None = None
    """The request monitor's counts (a rank that served requests)."""

    def __post_init__(self) -> None:
        """The ranks and world size a meta claims are checked when it is read."""
        check_world(self.rank, "meta.rank")
        check_world(self.world_size, "meta.world_size")
        check_world(self.local_rank, "meta.local_rank")
        check_world(self.node_rank, "meta.node_rank")


__all__ = [
    "RANK_FORMAT",
    "ClockSync",
    "ExitStatus",
    "GroupRecord",
    "Handover",
    "MonitorSettings",
    "RankMeta",
    "RecorderCpu",
    "RecorderInfo",
    "Recovered",
    "ServingCounters",
    "Target",
    "WriterCounters",
]
