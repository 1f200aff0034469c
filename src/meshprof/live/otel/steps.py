"""Steps as the OpenTelemetry exporter sends them: one rank's step with its phases and a
summary of its collectives (:class:`RankStep`), and the job's step across the ranks seen
(:class:`JobStep`). Pure functions over the rows a rank wrote (SPAN_DTYPE and EVENT_DTYPE, its
meta's tables); the live exporter and ``meshprof export --format otlp`` build the same records.

Times are on the common clock: each rank's own wall clock plus its offset (the live exporter:
the timestamp exchange at start; a finished run: the report's clock alignment).

Definitions (the live state's, :mod:`meshprof.session.live_publish`, at step granularity):

- a step's **collectives** are the completed collectives it issued: recorded with its step
  number and issued between its start and its end (one issued after the step's end and before
  the next step's start, a script's closing barrier, is in neither);
- its **communication** is the length of the union of their [issue, completion] intervals,
  clipped to the step;
- its **exposed communication** is min(max(wall − CPU time of the training thread, 0),
  communication): the part the training thread was blocked on;
- its **slowest collective** is the one that lasted longest, issue to completion; its **last
  arrival** is the member of its group that issued it last (among the ranks whose steps are at
  hand: every rank of the run post mortem, the node's ranks live), and its **arrival skew** the
  time from the first member's issue to the last's.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from meshprof.analyze.compute.intervals import clipped_total
from meshprof.events import CUSTOM_BASE, FLAG_UNSAMPLED, OP_NAMES, STATUS_CODES
from meshprof.layout import dimension_of
from meshprof.records.rank_meta import GroupRecord, RankMeta

_STEP_KIND = 0  # SPAN_KINDS.index("step")
_ERROR = STATUS_CODES["error"]


@dataclass(frozen=True, slots=True)
class RankTables:
    """What names a rank's rows: its meta's tables, its host and its clock offset."""

    rank: int
    """Global rank."""
    host: str = ""
    """The rank's host."""
    span_names: tuple[str, ...] = ()
    """Span name codes → names."""
    groups: tuple[GroupRecord, ...] = ()
    """Group codes → groups."""
    labels: tuple[str, ...] = ()
    """Custom op labels (op codes from CUSTOM_BASE)."""
    offset_ns: int = 0
    """Added to the rank's timestamps to put them on the common clock."""
    layout: object = None
    """The job's dp × tp × pp layout (a :class:`~meshprof.layout.Layout`), for dimensions."""

    @classmethod
    def of(
        cls, rank: int, meta: RankMeta | None, offset_ns: int = 0, layout: object = None
    ) -> RankTables:
        """The tables of ``meta`` (empty without one)."""
        m = meta or RankMeta()
        return cls(
            rank=rank,
            host=m.hostname or "",
            span_names=tuple(m.span_names or ()),
            groups=tuple(m.groups or ()),
            labels=tuple(m.labels or ()),
            offset_ns=int(offset_ns),
            layout=layout,
        )

    def span_name(self, code: int) -> str:
        return self.span_names[code] if 0 <= code < len(self.span_names) else f"span{code}"

    def op_name(self, code: int) -> str:
        if code >= CUSTOM_BASE:
            i = code - CUSTOM_BASE
            return self.labels[i] if i < len(self.labels) else f"op{code}"
        return OP_NAMES[code] if 0 <= code < len(OP_NAMES) else f"op{code}"

    def group(self, code: int) -> tuple[str, str, int, str]:
        """(name, description, members, dimension) of group ``code``."""
        if not 0 <= code < len(self.groups):
            return (f"group{code}", "", 0, "other")
        g = self.groups[code]
        ranks = g.ranks if g.ranks is not None else ()
        desc = g.desc or ""
        return (g.name or "", desc, len(ranks), dimension_of(ranks, self.layout, desc))

    def knows(self, spans: np.ndarray, events: np.ndarray) -> bool:
        """Every span name and group code of these rows is in the tables (else the meta that
        names them is newer than the tables: read it again)."""
        if len(spans) and int(spans["name"].max()) >= len(self.span_names):
            return False
        return not (len(events) and int(events["group"].max()) >= len(self.groups))


@dataclass(frozen=True, slots=True)
class PhaseSpan:
    """A phase inside a rank's step (``with monitor.phase(...)``, or a detected one)."""

    name: str
    """The phase's name (``forward``, ``backward``, ``optimizer``, ...)."""
    depth: int
    """1 for a phase of the step, 2 for one inside it, ..."""
    start_ns: int
    """Start, common clock (ns since the epoch)."""
    duration_ns: int
    """Length, ns."""
    error: bool
    """Its block raised."""
    parent: int
    """Index in the step's phases of the phase it lies in; -1: the step itself."""


@dataclass(frozen=True, slots=True)
class SlowestCollective:
    """The collective of a step that lasted longest on a rank (or in the job)."""

    rank: int
    """The rank it lasted that long on."""
    op: str
    """The collective (``all_reduce``, ...)."""
    group: str
    """Its group's description (``mesh_tp``), else its name."""
    dim: str
    """The group's parallel dimension."""
    seq: int
    """Its sequence number in the group."""
    start_ns: int
    """Issue on ``rank``, common clock."""
    duration_ns: int
    """Issue to completion on ``rank``, ns."""
    members: int
    """Members of its group."""
    peer: int = -1
    """The peer of a send/recv (-1 for a collective)."""
    last_arrival_rank: int = -1
    """The member that issued it last among those seen (-1: none but ``rank`` seen, or a
    send/recv)."""
    arrival_skew_ns: int = -1
    """The last member's issue − the first's, ns (-1 when not measured)."""
    members_seen: int = 0
    """Members whose issue was seen (at most ``members``)."""
    group_key: str = field(default="", compare=False)
    """The group's name (unique in the job): with ``seq``, what matches it across ranks."""


@dataclass(frozen=True, slots=True)
class CollectiveSummary:
    """A rank's step's collectives in a few figures (see the module docstring)."""

    count: int = 0
    """Completed collectives issued in the step."""
    comm_ns: int = 0
    """The union of their intervals inside the step, ns."""
    exposed_ns: int = 0
    """The part of it the training thread was blocked on, ns."""
    slowest: SlowestCollective | None = None
    """The longest of them (None without any)."""


@dataclass(frozen=True, slots=True, eq=False)
class Arrivals:
    """When a rank's step issued each of its collectives: sorted match keys (group, seq) and
    their issue times on the common clock."""

    keys: np.ndarray
    """int64, sorted: :func:`match_key` of (group name, seq)."""
    issued_ns: np.ndarray
    """int64: the issue time of each."""

    def of(self, key: int) -> int | None:
        i = int(np.searchsorted(self.keys, key))
        if i < len(self.keys) and int(self.keys[i]) == key:
            return int(self.issued_ns[i])
        return None


NO_ARRIVALS = Arrivals(np.zeros(0, np.int64), np.zeros(0, np.int64))


def match_key(group_name: str, seq: int) -> int:
    """One int64 for (group name, seq): what matches a collective across ranks."""
    return (zlib.crc32(group_name.encode()) << 31) ^ (int(seq) & 0x7FFFFFFF)


@dataclass(frozen=True, slots=True)
class RankStep:
    """One rank's step."""

    rank: int
    """Global rank."""
    step: int
    """Step number."""
    host: str
    """The rank's host."""
    start_ns: int
    """Start, common clock."""
    duration_ns: int
    """Length, ns."""
    error: bool = False
    """The step's block raised."""
    tokens: int = 0
    """Tokens processed (0: unknown)."""
    samples: int = 0
    """Samples processed (0: unknown)."""
    cpu_ns: int = -1
    """CPU time of the training thread in the step (-1: unknown)."""
    phases: tuple[PhaseSpan, ...] = ()
    """Its phases, by start."""
    collectives: CollectiveSummary = CollectiveSummary()
    """Its collectives."""
    arrivals: Arrivals = field(default=NO_ARRIVALS, compare=False, repr=False)
    """When it issued each collective (for the last arrivals)."""

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


@dataclass(frozen=True, slots=True, eq=False)
class PendingRankStep:
    """A rank's closed step with its rows, summarized only when it is sent (:meth:`build`):
    most steps are not, and their figures would cost the exporter for nothing."""

    row: np.void
    """Its step span row (SPAN_DTYPE)."""
    phases: np.ndarray
    """Its phase rows."""
    events: np.ndarray
    """The events it issued."""
    tables: RankTables
    """What names them."""

    @property
    def rank(self) -> int:
        return self.tables.rank

    @property
    def step(self) -> int:
        return int(self.row["step"])

    @property
    def start_ns(self) -> int:
        """Start, common clock."""
        return int(self.row["start_ns"]) + self.tables.offset_ns

    @property
    def duration_ns(self) -> int:
        return max(int(self.row["duration_ns"]), 0)

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns

    def build(self) -> RankStep:
        """The step with its phases and collectives."""
        return rank_step(self.row, self.phases, self.events, self.tables)


@dataclass(frozen=True, slots=True)
class JobStep:
    """One step across the ranks at hand."""

    step: int
    """Step number."""
    ranks: tuple[RankStep, ...]
    """Each rank's step, by rank."""
    reasons: tuple[str, ...] = ()
    """Why it was sent (:mod:`meshprof.live.otel.trace_sampling`)."""

    @property
    def start_ns(self) -> int:
        return min(r.start_ns for r in self.ranks)

    @property
    def end_ns(self) -> int:
        return max(r.end_ns for r in self.ranks)

    @property
    def slowest_rank(self) -> RankStep:
        """The rank whose step lasted longest."""
        return max(self.ranks, key=lambda r: (r.duration_ns, -r.rank))

    @property
    def slowest(self) -> SlowestCollective | None:
        """The longest collective of the step on any rank."""
        found = [r.collectives.slowest for r in self.ranks if r.collectives.slowest is not None]
        return max(found, key=lambda c: (c.duration_ns, -c.rank)) if found else None


def phase_spans(rows: np.ndarray, tables: RankTables) -> tuple[PhaseSpan, ...]:
    """A step's phase rows (depth ≥ 1) as phases, each with the phase it lies in."""
    if not len(rows):
        return ()
    order = np.lexsort((-rows["duration_ns"].astype(np.int64), rows["start_ns"]))
    out: list[PhaseSpan] = []
    open_at: dict[int, int] = {}  # depth -> index of the last phase at that depth
    for i in order.tolist():
        row = rows[i]
        depth = int(row["depth"])
        parent = open_at.get(depth - 1, -1) if depth > 1 else -1
        if parent >= 0:
            p = out[parent]
            start = int(row["start_ns"]) + tables.offset_ns
            if not p.start_ns <= start <= p.start_ns + p.duration_ns:
                parent = -1
        out.append(
            PhaseSpan(
                name=tables.span_name(int(row["name"])),
                depth=depth,
                start_ns=int(row["start_ns"]) + tables.offset_ns,
                duration_ns=max(int(row["duration_ns"]), 0),
                error=int(row["status"]) == _ERROR,
                parent=parent,
            )
        )
        open_at[depth] = len(out) - 1
    return tuple(out)


def summarize_collectives(
    events: np.ndarray, lo: int, hi: int, cpu_ns: int, tables: RankTables
) -> tuple[CollectiveSummary, Arrivals]:
    """A step's collectives (``events``: its EVENT_DTYPE rows; [lo, hi) the step on the rank's
    own clock) in a few figures, and when it issued each (common clock)."""
    if not len(events):
        return CollectiveSummary(), NO_ARRIVALS
    start_all = events["start_ns"]
    dur_all = events["duration_ns"]
    keep = (dur_all >= 0) & ((events["flags"] & FLAG_UNSAMPLED) == 0)
    keep &= (start_all >= lo) & (start_all < hi)
    idx = np.flatnonzero(keep)
    if not len(idx):
        return CollectiveSummary(), NO_ARRIVALS
    start = start_all[idx].astype(np.int64)
    dur = dur_all[idx].astype(np.int64)
    comm = clipped_total(start, start + dur, lo, hi)
    wall = hi - lo
    blocked = wall - cpu_ns if cpu_ns >= 0 else wall
    exposed = min(max(blocked, 0), comm)
    k = int(np.argmax(dur))
    row = events[int(idx[k])]
    name, desc, members, dim = tables.group(int(row["group"]))
    slowest = SlowestCollective(
        rank=tables.rank,
        op=tables.op_name(int(row["op"])),
        group=desc or name,
        dim=dim,
        seq=int(row["seq"]),
        start_ns=int(start[k]) + tables.offset_ns,
        duration_ns=int(dur[k]),
        members=members,
        peer=int(row["peer"]),
        group_key=name,
    )
    coll = idx[events["peer"][idx] < 0]
    if len(coll):
        codes = events["group"][coll].astype(np.int64)
        crc = np.zeros(int(codes.max()) + 1, np.int64)
        for g in np.unique(codes).tolist():
            crc[g] = zlib.crc32(tables.group(g)[0].encode())
        keys = (crc[codes] << 31) ^ (events["seq"][coll].astype(np.int64) & 0x7FFFFFFF)
        issued = start_all[coll].astype(np.int64) + tables.offset_ns
        order = np.argsort(keys, kind="stable")
        arrivals = Arrivals(keys[order], issued[order])
    else:
        arrivals = NO_ARRIVALS
    return CollectiveSummary(len(idx), comm, exposed, slowest), arrivals


def rank_step(
    step_row: np.void, phases: np.ndarray, events: np.ndarray, tables: RankTables
) -> RankStep:
    """One rank's step from its step span row, its phase rows and the events it issued."""
    lo = int(step_row["start_ns"])
    dur = max(int(step_row["duration_ns"]), 0)
    cpu = int(step_row["cpu_ns"])
    summary, arrivals = summarize_collectives(events, lo, lo + dur, cpu, tables)
    return RankStep(
        rank=tables.rank,
        step=int(step_row["step"]),
        host=tables.host,
        start_ns=lo + tables.offset_ns,
        duration_ns=dur,
        error=int(step_row["status"]) == _ERROR,
        tokens=max(int(step_row["tokens"]), 0),
        samples=max(int(step_row["samples"]), 0),
        cpu_ns=cpu,
        phases=phase_spans(phases, tables),
        collectives=summary,
        arrivals=arrivals,
    )


def rank_steps(spans: np.ndarray, events: np.ndarray, tables: RankTables) -> list[RankStep]:
    """Every closed step of a rank's rows (a finished run's), by step."""
    if not len(spans):
        return []
    spans = spans[spans["step"] >= 0]
    steps = spans[(spans["kind"] == _STEP_KIND) & (spans["depth"] == 0)]
    phases = spans[spans["depth"] > 0]
    phases = phases[np.argsort(phases["step"], kind="stable")]
    ev = events[np.argsort(events["step"], kind="stable")] if len(events) else events
    out = []
    for row in steps[np.argsort(steps["step"], kind="stable")]:
        s = int(row["step"])
        a, b = np.searchsorted(phases["step"], [s, s + 1])
        if len(ev):
            c, d = np.searchsorted(ev["step"], [s, s + 1])
            mine = ev[c:d]
        else:
            mine = ev
        out.append(rank_step(row, phases[a:b], mine, tables))
    return out


def join_arrivals(ranks: Sequence[RankStep]) -> tuple[RankStep, ...]:
    """Each rank's step with its slowest collective's last arrival, skew and members seen, from
    the other ranks' issue times of the same (group, seq) in ``ranks`` (one step's)."""
    out = []
    for r in ranks:
        c = r.collectives.slowest
        if c is None or c.peer >= 0:
            out.append(r)
            continue
        key = match_key(c.group_key, c.seq)
        seen = [(c.start_ns, r.rank)]
        for other in ranks:
            if other.rank != r.rank:
                t = other.arrivals.of(key)
                if t is not None:
                    seen.append((t, other.rank))
        last = max(seen)
        first = min(seen)
        c2 = replace(
            c,
            last_arrival_rank=last[1] if len(seen) > 1 else -1,
            arrival_skew_ns=last[0] - first[0] if len(seen) > 1 else -1,
            members_seen=len(seen),
        )
        out.append(replace(r, collectives=replace(r.collectives, slowest=c2)))
    return tuple(sorted(out, key=lambda x: x.rank))


__all__ = [
    "Arrivals",
    "CollectiveSummary",
    "JobStep",
    "PendingRankStep",
    "PhaseSpan",
    "RankStep",
    "RankTables",
    "SlowestCollective",
    "join_arrivals",
    "match_key",
    "phase_spans",
    "rank_step",
    "rank_steps",
]
