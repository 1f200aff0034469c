"""A discrete-event simulator of dp × tp × pp training jobs, written apart from meshprof's
analysis (numpy only): the truth its conclusions are checked against.

A :class:`Job` describes the parallel layout, the pipeline schedule, how point-to-point and
data-parallel communication behave, the compute and transfer times, the noise, the clocks and
what is slow. :func:`simulate` runs every rank's program event by event and returns the true
:class:`Timeline`; ``simulate(job, fix)`` re-runs the *same* job (the same random draws) with
some of its slowness removed (:class:`Fix`: ranks, groups, dimensions, links), so the
difference of the two timelines is the true saving of that fix (:func:`true_saving`).

Semantics (all times ns, on the true clock):

- A rank runs one instruction stream: compute (the rank is busy), issue an op (instant), wait
  for an op (blocked until it completes on this rank). A blocking op is an issue + a wait.
- A collective starts when its last member arrived and the previous collective of the same
  group has completed (a group's ops run in order, as on one NCCL stream or gloo queue); each
  member completes at start + the op's transfer time + a small per-member jitter.
- Point-to-point, *eager*: the send completes at its issue + the transfer time whether or not
  the receiver is there; the receive completes at max(its issue + 1 µs, send issue + transfer).
  *Rendezvous* (blocking) and *async* (isend/irecv, waited later): both complete at the later
  issue + the transfer time.
- Async collectives (DDP bucket all_reduces in the last backward, FSDP all_gather prefetch and
  reduce_scatters) run while the rank computes; they are waited for before the optimizer.
- Steps run back to back: data loading, the pipeline schedule (forward / backward of each
  microbatch on each model chunk), then the data-parallel sync (blocking reduce_scatter and
  all_gather in ``zero`` mode, or the waits of the async ones), a world all_reduce (the
  gradient norm) and the optimizer's compute.
- Slowness: a slow rank's compute in ``slow_phases`` takes ``1 + f`` times longer; a slow
  link multiplies its group's transfer times. Noise: each compute × (1 + ``jitter`` · N(0, 1)),
  each transfer + U(0, ``comm_jitter_ns``).
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, field

import numpy as np

US = 1_000
MS = 1_000_000
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved")
P2P_MODES = ("eager", "rendezvous", "async")
DP_MODES = ("zero", "ddp", "fsdp")
PHASES = ("data", "forward", "backward", "optimizer")
EAGER_RECV_NS = 1 * US
"""An eager receive whose data is already there completes this long after its issue."""

_C, _I, _W, _B, _E = range(5)  # instruction codes: compute, issue, wait, span begin, span end


@dataclass(frozen=True, slots=True)
class Job:
    """One simulated training job (times ns; fractions are of the base value)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    schedule: str = "1f1b"
    """Pipeline schedule (:data:`SCHEDULES`): "naive" (each stage computes its layers, then
    the stages pass activations along the chain: not data-dependent), "gpipe", "1f1b",
    "interleaved" (Megatron's interleaved 1F1B over ``chunks`` model chunks per rank)."""
    microbatches: int = 4
    chunks: int = 1
    """Model chunks (virtual stages) per rank; > 1 only with "interleaved"."""
    layers: int = 4
    """Layers per model chunk; each ends with a TP all_reduce when tp > 1."""
    p2p: str = "eager"
    """Point-to-point semantics (:data:`P2P_MODES`)."""
    p2p_back: str = ""
    """The backward direction's semantics (gradients, to the previous stage; "" = ``p2p``):
    a pipeline whose two directions behave differently."""
    batched: bool = False
    """A send followed by a receive with no compute between is issued with it as one batch
    (``batch_isend_irecv``: both async, then the receive waited for, then the send)."""
    tp_inflight: bool = False
    """The last TP all_reduce before each pipeline send is issued async and waited for only
    after the send (an async collective left in flight across the exchange)."""
    dp_mode: str = "zero"
    """Data-parallel sync (:data:`DP_MODES`): "zero" blocking reduce_scatter + all_gather after
    the pipeline, "ddp" async bucket all_reduces during the last backward, "fsdp" async
    all_gather prefetch in the first forward and async reduce_scatters in the last backward."""
    steps: int = 6
    fwd_ns: int = 400 * US
    """Forward compute of one layer for one microbatch."""
    bwd_factor: float = 2.0
    """Backward compute = this × forward."""
    data_ns: int = 200 * US
    opt_ns: int = 500 * US
    tp_ns: int = 30 * US
    """Transfer time of a TP all_reduce."""
    pp_ns: int = 40 * US
    """Transfer time of an activation or gradient between stages."""
    dp_ns: int = 300 * US
    """Transfer time of a DP collective (a bucket or a layer in ddp / fsdp mode)."""
    world_ns: int = 20 * US
    norm_ns: int = 0
    """Compute between the wait for the DP collectives and the world all_reduce (a local
    gradient norm before the global one)."""
    bucket_layers: int = 2
    """ddp: layers per gradient bucket."""
    jitter: float = 0.0
    """Relative standard deviation of each compute."""
    comm_jitter_ns: int = 0
    """Extra transfer time, uniform in [0, this) per op (a quarter of it per member)."""
    clock_ms: float = 20.0
    """Each rank's clock is off by a uniform draw in ± this (rank 0 exact)."""
    slow: tuple[tuple[int, float], ...] = ()
    """(rank, f): that rank's compute in ``slow_phases`` takes 1 + f times longer."""
    slow_phases: tuple[str, ...] = ("forward",)
    slow_links: tuple[tuple[str, float], ...] = ()
    """(group name, factor): that group's transfers take factor times longer."""
    seed: int = 0

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, r: int) -> tuple[int, int, int]:
        """(dp, tp, pp) coordinates of rank r (meshprof's layout: pp innermost)."""
        return r // (self.tp * self.pp), (r // self.pp) % self.tp, r % self.pp

    def rank(self, d: int, t: int, p: int) -> int:
        return d * self.tp * self.pp + t * self.pp + p

    def group_of(self, r: int, dim: str) -> str:
        """The name of rank r's group of dimension ``dim`` ("world" → "0")."""
        d, t, p = self.coords(r)
        if dim == "world":
            return "0"
        index = {"dp": t * self.pp + p, "tp": d * self.pp + p, "pp": d * self.tp + t}[dim]
        return f"{dim}{index}"


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    desc: str
    dim: str
    ranks: tuple[int, ...]


def groups(job: Job) -> list[Group]:
    """The world group, then every group of each dimension of size ≥ 2."""
    out = [Group("0", "default_pg", "world", tuple(range(job.world)))]
    size = {"dp": job.dp, "tp": job.tp, "pp": job.pp}
    for dim in ("dp", "tp", "pp"):
        if size[dim] < 2:
            continue
        by: dict[str, list[int]] = {}
        for r in range(job.world):
            by.setdefault(job.group_of(r, dim), []).append(r)
        out += [Group(n, f"mesh_{dim}", dim, tuple(m)) for n, m in by.items()]
    return out


@dataclass(frozen=True, slots=True)
class Fix:
    """What a counterfactual run repairs (the rest of the job, its noise included, is kept)."""

    ranks: frozenset[int] = frozenset()
    """These ranks compute at normal speed."""
    groups: frozenset[str] = frozenset()
    """Compute that precedes an op of these groups is at normal speed (on every rank)."""
    dims: frozenset[str] = frozenset()
    """Compute that precedes an op of a group of these dimensions is at normal speed."""
    links: frozenset[str] = frozenset()
    """These groups' transfers are at normal speed."""


@dataclass(frozen=True, slots=True)
class Op:
    """A collective or a point-to-point message."""

    name: str
    """"all_reduce", "all_gather", "reduce_scatter" or "p2p"."""
    group: str
    members: tuple[int, ...]
    """Collective: the group's ranks; p2p: (src, dst)."""
    seq: int
    """Per group (collectives) or per (src, dst) (p2p)."""
    transfer_ns: int
    nbytes: int
    is_async: bool
    prev: int
    """The group's previous collective (op index), -1 for none or p2p."""
    mode: str = ""
    """p2p: its semantics (:data:`P2P_MODES`)."""


@dataclass(slots=True)
class _Program:
    ops: list[Op] = field(default_factory=list)
    code: list[list[tuple[int, int]]] = field(default_factory=list)
    base: list[list[float]] = field(default_factory=list)
    """Per rank, per compute: base duration (ns)."""
    phase: list[list[str]] = field(default_factory=list)
    tag: list[list[str]] = field(default_factory=list)
    """Per rank, per compute: the group of the next op issued in the step ("" for the tail)."""


class _Builder:
    """Builds every rank's instruction stream and the op table."""

    def __init__(self, job: Job) -> None:
        self.job = job
        n = job.world
        self.p = _Program(code=[[] for _ in range(n)], base=[[] for _ in range(n)],
                          phase=[[] for _ in range(n)])  # fmt: skip
        self.members = {g.name: g.ranks for g in _groups(job)}
        self.index: dict[tuple[object, ...], int] = {}
        self.counter: dict[tuple[object, ...], int] = {}
        self.deferred: list[list[int]] = [[] for _ in range(n)]
        """Per rank: sends waiting for the receive they are batched with (``Job.batched``)."""

    def _op(self, key: tuple[object, ...], op: Op) -> int:
        if key not in self.index:
            self.index[key] = len(self.p.ops)
            self.p.ops.append(op)
        got = self.p.ops[self.index[key]]
        assert got.name == op.name and got.members == op.members, (key, got, op)
        return self.index[key]

    def _next(self, key: tuple[object, ...]) -> int:
        s = self.counter.get(key, 0)
        self.counter[key] = s + 1
        return s

    def flush(self, r: int) -> None:
        """Deferred sends issued alone (no receive came before the next compute)."""
        for i in self.deferred[r]:
            self.p.code[r] += [(_I, i), (_W, i)]
        self.deferred[r] = []

    def compute(self, r: int, ns: float, phase: str) -> None:
        self.flush(r)
        self.p.code[r].append((_C, len(self.p.base[r])))
        self.p.base[r].append(float(ns))
        self.p.phase[r].append(phase)

    def span(self, r: int, name: int, begin: bool) -> None:
        if (begin and name == PHASES.index("optimizer")) or (not begin and name == len(PHASES)):
            self.flush(r)  # (a batch never reaches into the optimizer)
        self.p.code[r].append((_B if begin else _E, name))

    def coll(self, r: int, name: str, dim: str, ns: int, nbytes: int, is_async: bool) -> int:
        """Issue a collective on rank r's ``dim`` group; blocking unless ``is_async``."""
        g = self.job.group_of(r, dim)
        members = self.members[g]
        seq = self._next((r, g))
        prev = self.index.get(("c", g, seq - 1), -1)
        i = self._op(("c", g, seq), Op(name, g, members, seq, ns, nbytes, is_async, prev))
        self.p.code[r].append((_I, i))
        if not is_async:
            self.p.code[r].append((_W, i))
        return i

    def p2p(self, r: int, peer: int, send: bool, pending: list[int], back: bool = False) -> None:
        """A send to / receive from ``peer`` (p2p mode of the job, ``p2p_back`` for the
        backward direction; an async send is waited for before the optimizer, through
        ``pending``; batched with the next receive when ``Job.batched``)."""
        job = self.job
        src, dst = (r, peer) if send else (peer, r)
        seq = self._next((r, "p2p", src, dst))
        mode = (job.p2p_back or job.p2p) if back else job.p2p
        batch = job.batched and mode != "eager"
        is_async = mode == "async" or batch
        g = job.group_of(r, "pp")
        i = self._op(
            ("p", src, dst, seq),
            Op("p2p", g, (src, dst), seq, job.pp_ns, 1 << 22, is_async, -1, mode),
        )
        if batch and send:
            self.deferred[r].append(i)
            return
        if batch and self.deferred[r]:  # isend(s) + irecv, then the waits
            sends, self.deferred[r] = self.deferred[r], []
            self.p.code[r] += [(_I, x) for x in sends] + [(_I, i), (_W, i)]
            self.p.code[r] += [(_W, x) for x in sends]
            return
        self.flush(r)
        self.p.code[r].append((_I, i))
        if send and is_async:
            pending.append(i)
        else:
            self.p.code[r].append((_W, i))

    def wait(self, r: int, i: int) -> None:
        self.p.code[r].append((_W, i))


@functools.lru_cache(maxsize=8)
def _groups(job: Job) -> tuple[Group, ...]:
    return tuple(groups(job))


def schedule_order(job: Job, p: int) -> list[tuple[str, int, int]]:
    """Stage p's (F or B, microbatch, chunk) in execution order."""
    m, v, pp = job.microbatches, job.chunks, job.pp
    if job.schedule in ("naive", "gpipe"):
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if job.schedule == "1f1b":
        w = min(pp - p - 1, m)
        out = [("F", i, 0) for i in range(w)]
        for i in range(m - w):
            out += [("F", w + i, 0), ("B", i, 0)]
        return out + [("B", i, 0) for i in range(m - w, m)]
    if job.schedule != "interleaved":
        raise ValueError(f"schedule {job.schedule!r}")
    assert m % pp == 0, "interleaved: microbatches must be a multiple of pp"
    total = m * v

    def mb_chunk(k: int, forward: bool) -> tuple[int, int]:
        c = (k // pp) % v
        return (k // (pp * v)) * pp + k % pp, c if forward else v - 1 - c

    w = min((pp - p - 1) * 2 + (v - 1) * pp, total)
    out = [("F", *mb_chunk(k, True)) for k in range(w)]
    for j in range(total - w):
        out += [("F", *mb_chunk(w + j, True)), ("B", *mb_chunk(j, False))]
    return out + [("B", *mb_chunk(k, False)) for k in range(total - w, total)]


def _build(job: Job) -> _Program:
    b = _Builder(job)
    n, L, pp, v = job.world, job.layers, job.pp, job.chunks
    span = {name: i for i, name in enumerate((*PHASES, "step"))}
    dp_async = job.dp > 1 and job.dp_mode in ("ddp", "fsdp")
    for r in range(n):
        _, _, p = job.coords(r)
        d, t, _ = job.coords(r)
        order = schedule_order(job, p)
        for _k in range(job.steps):
            b.span(r, span["step"], True)
            b.span(r, span["data"], True)
            b.compute(r, job.data_ns, "data")
            b.span(r, span["data"], False)
            pending: list[int] = []
            gathers: dict[tuple[int, int], int] = {}
            for kind, mb, c in order:
                vs = c * pp + p
                prev_rank = job.rank(d, t, (p - 1) % pp)
                next_rank = job.rank(d, t, (p + 1) % pp)
                has_prev, has_next = vs > 0, vs < pp * v - 1
                naive = job.schedule == "naive"
                if kind == "F":
                    b.span(r, span["forward"], True)
                    if has_prev and not naive:
                        b.p2p(r, prev_rank, False, pending)
                    for layer in range(L):
                        if dp_async and job.dp_mode == "fsdp" and mb == 0:
                            if layer == 0:
                                gathers[(c, 0)] = b.coll(r, "all_gather", "dp", job.dp_ns // 2,
                                                         1 << 24, True)  # fmt: skip
                            b.wait(r, gathers[(c, layer)])
                            if layer + 1 < L:
                                gathers[(c, layer + 1)] = b.coll(
                                    r, "all_gather", "dp", job.dp_ns // 2, 1 << 24, True
                                )
                        b.compute(r, job.fwd_ns, "forward")
                        if job.tp > 1:
                            fly = job.tp_inflight and has_next and layer == L - 1
                            i_tp = b.coll(r, "all_reduce", "tp", job.tp_ns, 1 << 20, fly)
                    if naive and has_prev:
                        b.p2p(r, prev_rank, False, pending)
                    if has_next:
                        b.p2p(r, next_rank, True, pending)
                        if job.tp > 1 and job.tp_inflight:
                            b.wait(r, i_tp)
                    b.span(r, span["forward"], False)
                else:
                    b.span(r, span["backward"], True)
                    if has_next and not naive:
                        b.p2p(r, next_rank, False, pending, back=True)
                    for j, layer in enumerate(reversed(range(L))):
                        b.compute(r, job.fwd_ns * job.bwd_factor, "backward")
                        if job.tp > 1:
                            fly = job.tp_inflight and has_prev and layer == 0
                            i_tp = b.coll(r, "all_reduce", "tp", job.tp_ns, 1 << 20, fly)
                        if dp_async and mb == job.microbatches - 1:
                            bucket_end = j % job.bucket_layers == job.bucket_layers - 1
                            if job.dp_mode == "fsdp":
                                pending.append(b.coll(r, "reduce_scatter", "dp", job.dp_ns // 2,
                                                      1 << 24, True))  # fmt: skip
                            elif bucket_end or layer == 0:
                                pending.append(
                                    b.coll(r, "all_reduce", "dp", job.dp_ns, 1 << 25, True)
                                )
                    if naive and has_next:
                        b.p2p(r, next_rank, False, pending, back=True)
                    if has_prev:
                        b.p2p(r, prev_rank, True, pending, back=True)
                        if job.tp > 1 and job.tp_inflight:
                            b.wait(r, i_tp)
                    b.span(r, span["backward"], False)
            b.span(r, span["optimizer"], True)
            for i in pending:
                b.wait(r, i)
            if job.dp > 1 and job.dp_mode == "zero":
                b.coll(r, "reduce_scatter", "dp", job.dp_ns, 1 << 26, False)
                b.coll(r, "all_gather", "dp", job.dp_ns, 1 << 26, False)
            if job.norm_ns:
                b.compute(r, job.norm_ns, "optimizer")
            if n > 1:
                b.coll(r, "all_reduce", "world", job.world_ns, 4, False)
            b.compute(r, job.opt_ns, "optimizer")
            b.span(r, span["optimizer"], False)
            b.span(r, span["step"], False)
    prog = b.p
    # each compute's tag: the group of the next op issued in its step ("" after the last)
    prog.tag = []
    for r in range(n):
        tags = [""] * len(prog.base[r])
        nxt = ""
        for code, x in reversed(prog.code[r]):
            if code == _E and x == span["step"]:
                nxt = ""
            elif code == _I:
                nxt = prog.ops[x].group
            elif code == _C:
                tags[x] = nxt
        prog.tag.append(tags)
    return prog


@dataclass(frozen=True, slots=True)
class _Draws:
    noise: list[np.ndarray]
    """Per rank, per compute: multiplier."""
    transfer: np.ndarray
    """Per op: extra transfer time (ns)."""
    member: list[np.ndarray]
    """Per op, per member: extra completion time (ns)."""
    offsets: np.ndarray
    """Per rank: its clock minus the true clock (ns)."""
    exchange: list[list[list[int]]]
    """Per rank: timestamp-exchange samples [local send, reference, local receive] (true
    clock, before the run; the writer adds the offsets)."""
    start: np.ndarray
    """Per rank: when its first step starts (ns)."""


@functools.lru_cache(maxsize=4)
def _prepared(job: Job) -> tuple[_Program, _Draws]:
    """The programs and every random draw: the same for a job whatever is fixed."""
    prog = _build(job)
    rng = np.random.default_rng(job.seed)
    noise = [np.maximum(1 + job.jitter * rng.standard_normal(len(b)), 0.2) for b in prog.base]
    cj = max(job.comm_jitter_ns, 0)
    transfer = rng.integers(0, cj + 1, size=len(prog.ops))
    member = [rng.integers(0, cj // 4 + 1, size=len(op.members)) for op in prog.ops]
    span = max(int(job.clock_ms * MS), 1)
    offsets = rng.integers(-span, span, size=job.world).astype(np.int64)
    offsets[0] = 0
    exchange: list[list[list[int]]] = []
    for r in range(job.world):
        t0, samples = -50 * MS, []
        for _ in range(10):
            d1, d2 = (int(x) for x in rng.integers(20 * US, 80 * US, size=2))
            samples.append([t0, t0 + d1, t0 + d1 + d2])
            t0 += d1 + d2 + 10 * US
        exchange.append(samples if r else [])
    start = rng.integers(0, 100 * US, size=job.world).astype(np.int64)
    return prog, _Draws(noise, transfer, member, offsets, exchange, start)


@dataclass(frozen=True, slots=True)
class Timeline:
    """What happened (true clock, ns)."""

    job: Job
    ops: list[Op]
    events: list[np.ndarray]
    """Per rank: int64 [event, 3] = (op index, issue, completion), in issue order."""
    step_of: list[np.ndarray]
    """Per rank: the step of each event."""
    spans: list[list[tuple[str, int, int, int, int]]]
    """Per rank: (name, step, start, end, compute inside) of every step and phase span."""
    step_start: np.ndarray
    """int64 [rank, step]."""
    step_end: np.ndarray
    """int64 [rank, step]."""
    compute: np.ndarray
    """int64 [rank, step]: time the rank computed inside the step."""
    offsets: np.ndarray
    exchange: list[list[list[int]]]

    @property
    def blocked(self) -> np.ndarray:
        """int64 [rank, step]: time the rank waited for communication (the exposed part)."""
        return self.step_end - self.step_start - self.compute

    @property
    def job_step_ns(self) -> np.ndarray:
        """float [step]: the job's step time: the end of the step's last rank minus that of
        the step before (the first step: minus the first start)."""
        end = self.step_end.max(axis=0).astype(np.float64)
        return np.diff(np.r_[float(self.step_start[:, 0].min()), end])


def _durations(job: Job, prog: _Program, draws: _Draws, fix: Fix) -> list[np.ndarray]:
    slow = dict(job.slow)
    dim_of = {g.name: g.dim for g in _groups(job)}
    out = []
    for r in range(job.world):
        base = np.asarray(prog.base[r]) * draws.noise[r]
        f = slow.get(r, 0.0)
        if f and r not in fix.ranks:
            hit = np.asarray(
                [
                    ph in job.slow_phases
                    and tg not in fix.groups
                    and dim_of.get(tg) not in fix.dims
                    for ph, tg in zip(prog.phase[r], prog.tag[r], strict=True)
                ],
                dtype=bool,
            )
            base = np.where(hit, base * (1 + f), base)
        out.append(np.rint(base).astype(np.int64))
    return out


def simulate(job: Job, fix: Fix = Fix()) -> Timeline:
    """Run the job (with ``fix`` applied) and return its true timeline."""
    prog, draws = _prepared(job)
    dur = [d.tolist() for d in _durations(job, prog, draws, fix)]
    ops = prog.ops
    links = {g: x for g, x in job.slow_links if g not in fix.links}
    xfer = [
        round(op.transfer_ns * links.get(op.group, 1.0)) + int(draws.transfer[i])
        for i, op in enumerate(ops)
    ]
    n = job.world
    arrived: list[dict[int, int]] = [{} for _ in ops]
    done: list[dict[int, int]] = [{} for _ in ops]
    finish = [0] * len(ops)
    waiting: list[list[int]] = [[] for _ in ops]
    ready = deque(range(n))
    clock = [int(x) for x in draws.start]
    pc = [0] * n
    busy = [0] * n
    events: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    spans: list[list[tuple[str, int, int, int, int]]] = [[] for _ in range(n)]
    open_: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    step = [-1] * n
    names = (*PHASES, "step")

    def complete(i: int, who: int, at: int) -> None:
        done[i][who] = at
        if waiting[i]:
            for x in waiting[i]:
                if x == who:
                    ready.append(x)
            waiting[i] = [x for x in waiting[i] if x != who]

    def progress(i: int) -> None:
        op, a = ops[i], arrived[i]
        if op.name != "p2p":
            if len(a) < len(op.members):
                return
            t0 = max(a.values())
            if op.prev >= 0:
                assert len(done[op.prev]) == len(ops[op.prev].members), "group order"
                t0 = max(t0, finish[op.prev])
            jit = draws.member[i]
            for j, m in enumerate(op.members):
                complete(i, m, t0 + xfer[i] + int(jit[j]))
            finish[i] = max(done[i].values())
            return
        src, dst = op.members
        if op.mode == "eager":
            if src in a and src not in done[i]:
                complete(i, src, a[src] + xfer[i])
            if src in a and dst in a and dst not in done[i]:
                complete(i, dst, max(a[dst] + EAGER_RECV_NS, a[src] + xfer[i]))
        elif src in a and dst in a and not done[i]:
            t0 = max(a[src], a[dst]) + xfer[i]
            complete(i, src, t0 + int(draws.member[i][0]))
            complete(i, dst, t0 + int(draws.member[i][1]))

    while ready:
        r = ready.popleft()
        code, now, k = prog.code[r], clock[r], pc[r]
        while k < len(code):
            c, x = code[k]
            if c == _C:
                d = dur[r][x]
                now += d
                busy[r] += d
            elif c == _I:
                arrived[x][r] = now
                events[r].append((x, now, step[r]))
                progress(x)
            elif c == _W:
                t_done = done[x].get(r)
                if t_done is None:
                    waiting[x].append(r)
                    break
                now = max(now, t_done)
            elif c == _B:
                if names[x] == "step":
                    step[r] += 1
                open_[r].append((x, now, busy[r]))
            else:
                y, t0, b0 = open_[r].pop()
                spans[r].append((names[y], step[r], t0, now, busy[r] - b0))
            k += 1
        pc[r], clock[r] = k, now
    stuck = [r for r in range(n) if pc[r] < len(prog.code[r])]
    if stuck:
        raise RuntimeError(f"deadlock: ranks {stuck[:8]} blocked ({job})")
    ev_out, step_out = [], []
    for r in range(n):
        rows = np.asarray([(i, a, done[i][r]) for i, a, _ in events[r]], dtype=np.int64).reshape(
            -1, 3
        )
        ev_out.append(rows)
        step_out.append(np.asarray([s for _, _, s in events[r]], dtype=np.int64))
    s_start = np.zeros((n, job.steps), dtype=np.int64)
    s_end, comp = s_start.copy(), s_start.copy()
    for r in range(n):
        for name, s, t0, t1, cpu in spans[r]:
            if name == "step":
                s_start[r, s], s_end[r, s], comp[r, s] = t0, t1, cpu
    return Timeline(job, ops, ev_out, step_out, spans, s_start, s_end, comp, draws.offsets,
                    draws.exchange)  # fmt: skip


def true_saving(job: Job, fix: Fix, base: Timeline | None = None) -> float:
    """How much shorter the job's step is with ``fix`` (ns, median over steps of the
    difference of :attr:`Timeline.job_step_ns`)."""
    a = base if base is not None else simulate(job)
    b = simulate(job, fix)
    return float(np.median(a.job_step_ns - b.job_step_ns))


def slow_fix_candidates(job: Job) -> dict[str, list[str]]:
    """The groups and dimensions whose fix can change anything: those of the slow ranks (a fix
    of anything else is the job itself, saving exactly 0)."""
    gs = {job.group_of(r, d) for r, _ in job.slow for d in ("dp", "tp", "pp", "world")}
    have = {g.name: g for g in _groups(job)}
    named = sorted(g for g in gs if g in have and len(have[g].ranks) >= 2)
    dims = sorted({have[g].dim for g in named})
    return {"groups": named, "dims": dims}


def random_job(rng: np.random.Generator, max_ranks: int = 64, seed: int | None = None) -> Job:
    """A job of the family the accuracy benchmark draws from: dp, tp, pp in 1..8 (at most
    ``max_ranks`` ranks), every schedule, p2p mode and DP mode, clock offsets, jitter, one to
    three slow ranks (at most a quarter of the ranks), a slow link, or none."""
    while True:
        dp, tp, pp = (int(x) for x in rng.choice([1, 1, 2, 2, 3, 4, 4, 8], size=3))
        if dp * tp * pp <= max_ranks and dp * tp * pp >= 2:
            break
    schedule = str(rng.choice(SCHEDULES)) if pp > 1 else "gpipe"
    chunks = int(rng.choice([2, 3])) if schedule == "interleaved" else 1
    m = 1 if schedule == "naive" else int(rng.choice([1, 2, 4, 8]))
    if schedule == "interleaved":
        m = pp * int(rng.choice([1, 2]))
    modes = ["eager", "async"] + (["rendezvous"] if schedule in ("naive", "gpipe") else [])
    layers = int(rng.integers(2, 5)) if schedule != "interleaved" else 2
    while m * layers * max(chunks, 1) > 48 and m > 1:
        m //= 2
        if schedule == "interleaved" and m % pp:
            m = pp
            break
    n = dp * tp * pp
    kind = rng.random()
    slow: tuple[tuple[int, float], ...] = ()
    links: tuple[tuple[str, float], ...] = ()
    if kind < 0.1:
        pass  # balanced
    elif kind < 0.2:
        dims = [d for d, s in (("dp", dp), ("tp", tp), ("pp", pp)) if s > 1]
        dim = str(rng.choice(dims))
        links = ((Job(dp=dp, tp=tp, pp=pp).group_of(int(rng.integers(n)), dim), 3.0),)
    else:
        # a few slow ranks (at most a quarter of the job: the others are the reference)
        k = int(rng.choice([1, 1, 1, 2, 3]))
        who = rng.choice(n, size=min(k, max(1, n // 4)), replace=False)
        slow = tuple((int(r), float(rng.uniform(0.1, 0.5))) for r in who)
    return Job(
        dp=dp,
        tp=tp,
        pp=pp,
        schedule=schedule,
        microbatches=m,
        chunks=chunks,
        layers=layers,
        p2p=str(rng.choice(modes)) if pp > 1 else "eager",
        dp_mode=str(rng.choice(DP_MODES)) if dp > 1 else "zero",
        steps=6,
        fwd_ns=int(rng.integers(100, 500)) * US,
        tp_ns=int(rng.integers(10, 60)) * US,
        pp_ns=int(rng.integers(20, 100)) * US,
        dp_ns=int(rng.integers(100, 600)) * US,
        jitter=float(rng.choice([0.0, 0.01, 0.02])),
        comm_jitter_ns=int(rng.choice([0, 2 * US, 5 * US])),
        clock_ms=20.0,
        slow=slow,
        slow_phases=("forward",) if rng.random() < 0.6 else ("forward", "backward", "optimizer"),
        slow_links=links,
        seed=int(rng.integers(1 << 31)) if seed is None else seed,
    )
