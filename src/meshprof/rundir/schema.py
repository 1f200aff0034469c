"""The run directory's schema: where each file is, and the typed JSON records it holds.

::

    DIR/manifest.json          Manifest: written by the launcher (or rank 0 of the decorator /
                               the demo); with several nodes each launcher rewrites it merged with
                               every node record
    DIR/nodes/NODE.json        one record per launcher (node), merged into the manifest on load
    DIR/rank00000.npz ...      one file per rank: EVENT/SPAN/MEMORY columns + RankMeta as JSON
    DIR/traces/                torch.profiler traces (optional)
    DIR/hang/                  watchdog dumps (optional)

:class:`RankMeta` (a rank file's ``meta``) and :class:`Manifest` (``manifest.json``) are frozen
records with ``from_dict`` / ``to_dict``: every key meshprof knows is a typed attribute, keys it
does not know are kept in ``extra``, and the key order read is kept, so
``Manifest.from_dict(d).to_dict() == d`` key for key (a file rewritten by this version loses
nothing a newer one added). ``record["key"]`` reads the JSON value under an on-disk key.

:func:`resolve_layout` is the one place that decides a rank's dp/tp/pp layout.
Times are integers in ns since the epoch (``*_ns``) unless a name says otherwise.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from meshprof.layout import Layout

RANK_FORMAT = "meshprof-rank/1"
"""The ``format`` of a rank file's meta."""
RUN_FORMAT = "meshprof-run/1"
"""The ``format`` of manifest.json."""
MANIFEST = "manifest.json"
NODES_DIR = "nodes"
HANG_DIR = "hang"
TRACES_DIR = "traces"
RANK_FILE_RE = re.compile(r"^rank(\d+)\.npz$")
"""Names of rank files; group 1 is the rank."""


def rank_file(run_dir: str | Path, rank: int) -> Path:
    """Where rank ``rank``'s file is: ``DIR/rank00003.npz``."""
    return Path(run_dir) / f"rank{rank:05d}.npz"


def node_record_path(run_dir: str | Path, node_id: str) -> Path:
    """Where the launcher ``node_id`` keeps its node record (``DIR/nodes/<safe id>.json``)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", node_id) or "node"
    return Path(run_dir) / NODES_DIR / f"{safe}.json"


R = TypeVar("R", bound="JsonRecord")


@dataclass(frozen=True, slots=True, kw_only=True)
class JsonRecord:
    """A JSON object with typed known keys (the subclass' fields; None = key absent, unless
    the key was read with a null value) and the unknown ones in :attr:`extra`."""

    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know, kept as read (written back unchanged)."""
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """The keys as read, in file order (empty for a record built in code)."""

    _NESTED: ClassVar[dict[str, Any]] = {}
    """field name -> record class for nested typed values (``from_dict`` / ``to_dict``)."""

    @classmethod
    def known_keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in _BASE_FIELDS)

    @classmethod
    def from_dict(cls: type[R], d: dict[str, Any]) -> R:
        """The record of a JSON object (unknown keys go to ``extra``, the order is kept)."""
        known = set(cls.known_keys())
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in d.items():
            if k in known:
                nested = cls._NESTED.get(k)
                kwargs[k] = nested.from_dict(v) if nested and isinstance(v, dict) else v
            else:
                extra[k] = v
        return cls(**kwargs, extra=extra, key_order=tuple(d))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: keys as read (in their order), then set fields, then new extras."""
        known = self.known_keys()
        order = list(self.key_order)
        seen = set(order)
        order += [k for k in known if k not in seen and getattr(self, k) is not None]
        order += [k for k in self.extra if k not in seen]
        out: dict[str, Any] = {}
        kset = set(known)
        for k in order:
            if k in kset:
                v = getattr(self, k)
                out[k] = v.to_dict() if isinstance(v, JsonRecord | ExitStatus) else v
            elif k in self.extra:
                out[k] = self.extra[k]
        return out

    def updated(self: R, **changes: Any) -> R:
        """A copy with ``changes`` (known keys set as attributes, others in ``extra``)."""
        known = set(self.known_keys())
        fields_ = {
            k: (self._NESTED[k].from_dict(v) if k in self._NESTED and isinstance(v, dict) else v)
            for k, v in changes.items()
            if k in known
        }
        extra = {**self.extra, **{k: v for k, v in changes.items() if k not in known}}
        order = self.key_order or tuple(self.to_dict())  # keep keys set to None from now on
        order = order + tuple(k for k in changes if k not in order)
        return dataclasses.replace(self, **fields_, extra=extra, key_order=order)

    def __getitem__(self, key: str) -> Any:
        """The JSON value under the on-disk ``key`` (KeyError when absent)."""
        return self.to_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()


_BASE_FIELDS = frozenset({"extra", "key_order"})


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
    def from_dict(cls, d: dict[str, Any]) -> ExitStatus:
        return cls(
            how=str(d.get("how", "")),
            code=d.get("code"),
            error=str(d.get("error", "")),
            t_ns=int(d.get("t_ns") or 0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMeta(JsonRecord):
    """A rank file's ``meta`` (JSON): who recorded, the tables that name the event columns'
    codes, exact statistics, and what the launcher/bootstrap added. Every field is optional
    (None: absent); :class:`meshprof.rundir.rankfile.RankData` gives defaults."""

    _NESTED: ClassVar[dict[str, Any]] = {"exit": ExitStatus}

    format: str | None = None
    """:data:`RANK_FORMAT`."""
    meshprof_version: str | None = None
    torch_version: str | None = None
    rank: int | None = None
    """Global rank."""
    world_size: int | None = None
    hostname: str | None = None
    pid: int | None = None
    created_ns: int | None = None
    """When the recorder was created."""
    exported_ns: int | None = None
    """When this meta was assembled (the write)."""
    total_events: int | None = None
    """Events recorded since start (retained + evicted)."""
    retained_events: int | None = None
    evicted_events: int | None = None
    dropped_events: int | None = None
    recorder: dict[str, Any] | None = None
    """Which dispatcher kernel recorded: {kernel: "python" | "native", handover: {from, to,
    at_ns} when the Python kernel handed over to the native one during the run}."""
    recorder_cpu: dict[str, Any] | None = None
    """CPU of meshprof's own threads at this write: {threads_ns: {thread name: ns}, total_ns,
    collectives, per_collective_ns, per_second_ms} (``CommProfiler.recorder_cpu``)."""
    internal_errors: int | None = None
    first_internal_error: str | None = None
    groups: list[dict[str, Any]] | None = None
    """[{name, desc, ranks, backend}] indexed by the events' ``group`` code."""
    config: dict[str, Any] | None = None
    """The recorder's ProfilerConfig.to_dict()."""
    dtypes: list[str] | None = None
    """Names of the events' ``dtype`` codes."""
    labels: list[str] | None = None
    """Custom op labels; op code CUSTOM_BASE + i names labels[i]."""
    errors: dict[str, str] | None = None
    """Error text by event row index (as a string)."""
    metadata: dict[str, Any] | None = None
    """User metadata by event row index (as a string)."""
    stats: dict[str, Any] | None = None
    """Exact statistics (Accumulator.to_dict) over every event, evicted ones included."""
    first_event_id: int | None = None
    """Recorder id of the first row of ``events``."""
    span_names: list[str] | None = None
    """Names of the spans' ``name`` codes."""
    monitor: dict[str, Any] | None = None
    """The step monitor's settings (StepMonitor.to_meta: layout, thresholds, ...)."""
    writer: dict[str, Any] | None = None
    """The rank writer's counters: writes, interval_s, failures."""
    exit: ExitStatus | None = None
    """How the process ended (absent while it runs)."""
    target: dict[str, Any] | None = None
    """``meshprof run``: the script or module ({kind, name, args})."""
    local_rank: int | None = None
    node_rank: int | None = None
    node_id: str | None = None
    """The launcher (node) this rank ran under."""
    torchrun_restart: int | None = None
    bootstrap_start_ns: int | None = None
    layout: dict[str, int] | None = None
    """The dp/tp/pp layout as given (read it through :func:`resolve_layout`)."""
    layout_assumed: bool | None = None
    """True when no layout was given and pure data parallelism was assumed."""
    step_detection: str | None = None
    """"optimizer" when steps were detected automatically."""
    steps_detected: int | None = None
    hang_timeout_s: float | None = None
    backend: str | None = None
    """The default process group's backend."""
    clock_sync: dict[str, Any] | None = None
    """Timestamp exchange at start (meshprof.comm.clocksync.exchange_timestamps)."""
    current_step: int | None = None
    """The step the rank was in at this write (the recorder's step; -1 before the first)."""
    recovered: dict[str, Any] | None = None
    """Set when this data was recovered from the crash-safe files of a rank that died without
    writing its final rank file (:mod:`meshprof.rundir.crashsafe`): ``from``, ``tick_ns`` (wall
    clock of the last tick: the data is complete up to it), ``step`` and ``step_ns`` (the step
    the rank was in and when it began), ``pid``, ``ticks``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest(JsonRecord):
    """``manifest.json``: what ran, where, with which settings, and how it ended (job level)."""

    format: str | None = None
    """:data:`RUN_FORMAT`."""
    source: str | None = None
    """Who wrote the run directory when not ``meshprof run`` ("performance_monitor", "demo")."""
    command: list[str] | str | None = None
    """The command line as typed (a string for synthetic runs)."""
    torchrun_command: list[str] | None = None
    target: dict[str, Any] | None = None
    world_size: int | None = None
    nnodes: str | int | None = None
    nproc_per_node: int | None = None
    node_rank: int | None = None
    hosts: list[str] | None = None
    launcher_host: str | None = None
    cwd: str | None = None
    versions: dict[str, Any] | None = None
    layout: dict[str, int] | None = None
    settings: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    start_ns: int | None = None
    start_time: str | None = None
    end_ns: int | None = None
    end_time: str | None = None
    exit_code: int | None = None
    status: str | None = None
    """Worst node's: "hang", "failed", "running" or "ok"."""
    nodes: list[dict[str, Any]] | None = None
    rank_exit_codes: dict[str, Any] | None = None
    """Global rank (as a string) -> its exit code; negative: it died of that signal (-9:
    SIGKILL), as torchrun reports it."""
    rank_signals: dict[str, str] | None = None
    """Global rank -> the signal it died of ("SIGKILL", "SIGTERM", ...), for signal deaths."""
    torchrun_exit_code: int | None = None
    missing_ranks: dict[str, str] | None = None
    hang: dict[str, Any] | None = None


def resolve_layout(meta: RankMeta | None, manifest: Manifest | None = None) -> Layout | None:
    """The dp/tp/pp layout a rank ran with: its step monitor's, else its meta's, else the
    manifest's; None when none says."""
    mon = (meta.monitor if meta is not None else None) or {}
    given = (
        mon.get("layout")
        or (meta.layout if meta is not None else None)
        or (manifest.layout if manifest is not None else None)
    )
    try:
        return Layout.from_any(given)
    except (TypeError, ValueError):
        return None


__all__ = [
    "HANG_DIR",
    "MANIFEST",
    "NODES_DIR",
    "RANK_FILE_RE",
    "RANK_FORMAT",
    "RUN_FORMAT",
    "TRACES_DIR",
    "ExitStatus",
    "JsonRecord",
    "Manifest",
    "RankMeta",
    "node_record_path",
    "rank_file",
    "resolve_layout",
]
