"""Where a rank's step time goes: a pure function over its spans, collectives and memory samples.

Definitions (all per step, then averaged over the analyzed steps):

* **Communication time** (total) — the length of the union of the step's collective intervals
  [issue, completion], overall and per parallel dimension.
* **Exposed communication** — communication on the step's critical path, i.e. time the training
  thread spent waiting for it. For each top-level phase (and the rest of the step outside any
  phase) the thread's *blocked* time is wall time − its CPU time (``time.thread_time_ns``); the
  exposed part of the phase is min(blocked, communication inside the phase). A synchronous
  collective blocks the thread, so it is fully exposed; an asynchronous one (DDP buckets, FSDP2
  prefetch) running while the thread computes is *hidden*. Hidden = total − exposed. Per
  dimension, a phase's exposed time is split in proportion to each dimension's communication in
  that phase. This host-side definition is exact on CPU/gloo; on CUDA the host's blocked time is
  time spent in synchronizing calls, and kernel-level overlap needs a torch.profiler trace.
* **Pipeline bubble** (measured) — per step, 1 − (union of this stage's forward/backward chunk
  intervals) / (the schedule window: the top-level phase that contains the chunks). Theory for
  GPipe and 1F1B: (p−1)/(m+p−1); interleaved 1F1B with v virtual stages: (p−1)/(v·m+p−1).
  Utilization = 1 − bubble.
* **DP efficiency** — 1 − exposed DP communication / step time.
* **TP efficiency** — 1 − TP communication inside forward and backward / forward+backward time
  (TP collectives sit between the layers' matmuls, so they are on the critical path).
* **MFU** — FLOPs per step / step time / peak FLOP/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from meshprof.events import SPAN_KINDS
from meshprof.monitor.bottlenecks import (
    Bottleneck,
    BottleneckThresholds,
    rule_data_loading,
    rule_exposed_comm,
    rule_memory,
    rule_pipeline,
    rule_tp,
)
from meshprof.monitor.dimensions import Layout, dimension_of
from meshprof.monitor.flops import mfu
from meshprof.monitor.intervals import Segments, clipped_total

PIPELINE_CHUNKS = ("pp_forward", "pp_backward", "pp_backward_weight")
DATA_PHASES = ("data", "data_loading", "dataloader")
FB_PHASES = ("forward", "backward", "forward_backward")
_STEP = SPAN_KINDS.index("step")
_PHASE = SPAN_KINDS.index("phase")


@dataclass(frozen=True, slots=True)
class Distribution:
    """Mean, median and 95th percentile of a time over steps (nanoseconds)."""

    count: int
    mean_ns: float
    p50_ns: float
    p95_ns: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if len(values) == 0:
            return cls(0, math.nan, math.nan, math.nan)
        a = np.asarray(values, dtype=np.float64)
        return cls(
            len(a), float(a.mean()), float(np.percentile(a, 50)), float(np.percentile(a, 95))
        )


@dataclass(frozen=True, slots=True)
class PhaseStats:
    """Time per step spent in one named phase (summed when it occurs several times in a step)."""

    name: str
    time: Distribution
    share_of_step: float
    """Mean phase time / mean step time."""


@dataclass(frozen=True, slots=True)
class CommDimStats:
    """Communication of one parallel dimension, per step on average."""

    dimension: str
    """dp, tp, pp, world or other."""
    count: int
    """Collectives per step."""
    bytes: int
    """nccl-tests bytes per step (max(in, out))."""
    total_ns: float
    exposed_ns: float
    hidden_ns: float
    total_share: float
    """total_ns / mean step time."""
    exposed_share: float
    """exposed_ns / mean step time."""


@dataclass(frozen=True, slots=True)
class PipelineStats:
    """The pipeline bubble of this stage."""

    schedule: str
    stages: int
    microbatches: int
    virtual_stages: int
    bubble: float
    """Measured bubble fraction (mean over steps)."""
    bubble_theory: float | None
    utilization: float
    """1 − bubble."""


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """Memory over the analyzed steps (bytes)."""

    kind: str
    """"cuda" (allocator) or "cpu" (resident set size)."""
    current_bytes: int
    peak_bytes: int
    mean_bytes: float
    mean_over_peak: float
    capacity_bytes: int
    headroom_bytes: int
    peak_fraction: float
    """peak / capacity (0 when the capacity is unknown)."""


@dataclass(frozen=True, slots=True)
class FlopsStats:
    flops_per_step: float
    achieved_tflops: float
    peak_tflops: float | None
    mfu: float | None


@dataclass(frozen=True, slots=True)
class StepRow:
    """One analyzed step."""

    step: int
    duration_ns: int
    cpu_ns: int
    comm_ns: int
    exposed_comm_ns: int
    compute_ns: int
    """Step time minus exposed communication."""
    tokens: int
    samples: int


@dataclass(frozen=True, slots=True)
class StepAnalysis:
    """Where this rank's step time goes (see the module docstring for the definitions)."""

    rank: int
    steps: int
    """Steps analyzed (after warm-up)."""
    warmup_steps: int
    step_time: Distribution
    tokens_per_s: float
    samples_per_s: float
    phases: list[PhaseStats]
    comm: list[CommDimStats]
    comm_total_share: float
    comm_exposed_share: float
    data_loading_share: float
    dp_efficiency: float | None
    tp_efficiency: float | None
    pipeline: PipelineStats | None
    memory: MemoryStats | None
    flops: FlopsStats | None
    bottlenecks: list[Bottleneck]
    per_step: list[StepRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def clean(x: Any) -> Any:
            if isinstance(x, float) and math.isnan(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, list):
                return [clean(v) for v in x]
            return x

        return clean(asdict(self))


def _group_fields(g: Any) -> tuple[tuple[int, ...], str]:
    if isinstance(g, dict):
        return tuple(g.get("ranks", ())), str(g.get("desc", ""))
    return tuple(getattr(g, "ranks", ())), str(getattr(g, "desc", ""))


def analyze_steps(
    spans: np.ndarray,
    span_names: Sequence[str],
    events: np.ndarray,
    groups: Sequence[Any],
    memory: np.ndarray,
    *,
    rank: int = 0,
    layout: Layout | None = None,
    schedule: str = "",
    microbatches: int = 0,
    virtual_stages: int = 1,
    flops_per_step: float | None = None,
    peak_tflops: float | None = None,
    thresholds: BottleneckThresholds | None = None,
    warmup_steps: int = 0,
) -> StepAnalysis:
    """Analyze one rank. ``spans``/``events``/``memory`` are SPAN_DTYPE, EVENT_DTYPE and
    MEMORY_DTYPE arrays on the same clock; ``groups`` index the events' group codes."""
    th = thresholds or BottleneckThresholds()
    names = list(span_names)
    steps_all = spans[(spans["kind"] == _STEP)]
    steps_all = steps_all[np.argsort(steps_all["start_ns"], kind="stable")]
    warm = min(warmup_steps, max(len(steps_all) - 1, 0))
    steps = steps_all[warm:]
    phases = spans[spans["kind"] == _PHASE]

    dims = [dimension_of(_group_fields(g)[0], layout, _group_fields(g)[1]) for g in groups]
    ev = events[events["duration_ns"] >= 0]
    ev_start = ev["start_ns"].astype(np.int64)
    ev_end = ev_start + ev["duration_ns"].astype(np.int64)
    labels = [*dims, "other"]
    g = ev["group"].astype(np.int64)
    ev_label = np.where(g < len(dims), g, len(dims))
    dim_names = sorted({str(labels[i]) for i in np.unique(ev_label).tolist()})
    to_code = np.asarray([dim_names.index(x) if x in dim_names else -1 for x in labels])
    ev_dcode = to_code[ev_label] if len(ev) else np.zeros(0, dtype=np.int64)
    ev_bytes = np.maximum(ev["in_bytes"], ev["out_bytes"]).astype(np.int64)

    rows: list[StepRow] = []
    phase_totals: dict[str, list[float]] = {}
    dim_total: dict[str, list[float]] = {d: [] for d in dim_names}
    dim_exposed: dict[str, list[float]] = {d: [] for d in dim_names}
    dim_count: dict[str, list[int]] = {d: [] for d in dim_names}
    dim_bytes: dict[str, list[int]] = {d: [] for d in dim_names}
    data_time: list[float] = []
    fb_time: list[float] = []
    tp_fb_comm: list[float] = []
    bubbles: list[float] = []

    # Every per-step question below ("communication of this subset of the step's collectives
    # inside this window") is answered for all steps at once (intervals.Segments): the step's
    # collectives are those issued in [t0, t1), a contiguous range of the start-sorted events.
    ev_order = np.argsort(ev_start, kind="stable")
    es_all, ee_all = ev_start[ev_order], ev_end[ev_order]
    ed_all, eb_all = ev_dcode[ev_order], ev_bytes[ev_order]
    st_start = steps["start_ns"].astype(np.int64)
    st_dur = steps["duration_ns"].astype(np.int64)
    seg_lo = np.searchsorted(es_all, st_start, side="left")
    seg_hi = np.maximum(np.searchsorted(es_all, st_start + st_dur, side="left"), seg_lo)
    segs = Segments(es_all, ee_all, seg_lo, seg_hi, st_start)

    # the phases of each step: same step number, issued inside the step, in recorded order
    p_step = phases["step"].astype(np.int64)
    p_order = np.argsort(p_step, kind="stable")
    p_sorted = p_step[p_order]
    st_no = steps["step"].astype(np.int64)
    p_lo = np.searchsorted(p_sorted, st_no, side="left").tolist()
    p_hi = np.searchsorted(p_sorted, st_no, side="right").tolist()
    p_order_l = p_order.tolist()
    p_start = phases["start_ns"].astype(np.int64).tolist()
    p_dur = phases["duration_ns"].astype(np.int64).tolist()
    p_cpu = phases["cpu_ns"].astype(np.int64).tolist()
    p_depth = phases["depth"].tolist()
    p_nm = phases["name"].tolist()
    p_label = [names[i] if i < len(names) else str(i) for i in p_nm]
    p_is_fb = [i < len(names) and names[i] in FB_PHASES for i in p_nm]
    p_is_chunk = [i < len(names) and names[i] in PIPELINE_CHUNKS for i in p_nm]
    st_rows = list(
        zip(
            st_no.tolist(),
            st_start.tolist(),
            st_dur.tolist(),
            steps["cpu_ns"].astype(np.int64).tolist(),
            steps["tokens"].astype(np.int64).tolist(),
            steps["samples"].astype(np.int64).tolist(),
            strict=True,
        )
    )
    step_ph: list[list[int]] = []
    w_seg: list[int] = []  # windows: the top-level phases, then the fb phases
    w_lo: list[int] = []
    w_hi: list[int] = []
    for k, (_, t0, dur, _, _, _) in enumerate(st_rows):
        t1 = t0 + dur
        ph_k = [i for i in p_order_l[p_lo[k] : p_hi[k]] if t0 <= p_start[i] < t1]
        step_ph.append(ph_k)
        for i in ph_k:
            if p_depth[i] == 1:
                w_seg.append(k)
                w_lo.append(p_start[i])
                w_hi.append(p_start[i] + p_dur[i])
    n_top = len(w_seg)
    for k, ph_k in enumerate(step_ph):
        for i in ph_k:
            if p_is_fb[i]:
                w_seg.append(k)
                w_lo.append(p_start[i])
                w_hi.append(p_start[i] + p_dur[i])
    # one call per subset of the events (each computes that subset's union once) over all the
    # windows: the top-level phases, the fb phases, then the steps themselves
    n_fb = len(w_seg) - n_top
    step_k = np.arange(len(st_rows), dtype=np.int64)
    ws = np.concatenate([np.asarray(w_seg, dtype=np.int64), step_k])
    wa = np.concatenate([np.asarray(w_lo, dtype=np.int64), st_start])
    wb = np.concatenate([np.asarray(w_hi, dtype=np.int64), st_start + st_dur])
    n_w = len(ws)
    top_sl, step_sl = slice(0, n_top), slice(n_top + n_fb, n_w)
    not_fb = np.r_[
        np.ones(n_top, dtype=bool),
        np.zeros(n_fb, dtype=bool),
        np.ones(n_w - n_top - n_fb, dtype=bool),
    ]
    sel_w = np.flatnonzero(not_fb)

    def totals(sub: np.ndarray | None, which: np.ndarray) -> np.ndarray:
        out = np.zeros(n_w, dtype=np.int64)
        out[which] = segs.clipped_totals(sub, ws[which], wa[which], wb[which])
        return out

    all_w = totals(None, sel_w)
    top_comm = all_w[top_sl].tolist()
    step_comm = all_w[step_sl].tolist()
    top_dim: list[list[int]] = []
    step_dim: list[list[int]] = []
    cnt_dim: list[list[int]] = []
    bytes_dim: list[list[int]] = []
    tp_code = dim_names.index("tp") if "tp" in dim_names else -1
    fb_tp: list[int] = [0] * n_fb
    for di in range(len(dim_names)):
        sub = ed_all == di
        # the tp subset also answers the fb windows
        w = totals(sub, np.arange(n_w) if di == tp_code else sel_w)
        top_dim.append(w[top_sl].tolist())
        step_dim.append(w[step_sl].tolist())
        if di == tp_code:
            fb_tp = w[n_top : n_top + n_fb].tolist()
        cs = np.zeros(len(sub) + 1, dtype=np.int64)
        np.cumsum(sub, out=cs[1:])
        cnt_dim.append((cs[seg_hi] - cs[seg_lo]).tolist())
        np.cumsum(np.where(sub, eb_all, 0), out=cs[1:])
        bytes_dim.append((cs[seg_hi] - cs[seg_lo]).tolist())

    top_w = 0
    fb_w = 0
    for k, (s_no, t0, dur, cpu_step, tok, smp) in enumerate(st_rows):
        t1 = t0 + dur
        ph_k = step_ph[k]
        per_name: dict[str, float] = {}
        for i in ph_k:
            per_name[p_label[i]] = per_name.get(p_label[i], 0.0) + float(p_dur[i])
        for n, v in per_name.items():
            phase_totals.setdefault(n, []).append(v)
        data_time.append(sum(v for n, v in per_name.items() if n in DATA_PHASES))
        comm_total = step_comm[k]

        # exposed communication, phase by phase (top-level phases + the remainder of the step)
        exposed_by_dim = dict.fromkeys(dim_names, 0.0)
        covered_wall = covered_cpu = 0
        covered_comm = 0
        exposed_total = 0.0
        for i in ph_k:
            if p_depth[i] != 1:
                continue
            wall, cpu = p_dur[i], p_cpu[i]
            comm_p = top_comm[top_w]
            covered_wall += wall
            covered_cpu += max(cpu, 0)
            covered_comm += comm_p
            blocked = wall - cpu if cpu >= 0 else wall
            exp = float(min(max(blocked, 0), comm_p))
            exposed_total += exp
            _split(exp, [c[top_w] for c in top_dim], dim_names, exposed_by_dim)
            top_w += 1
        rest_wall = dur - covered_wall
        rest_comm = max(comm_total - covered_comm, 0)
        if rest_comm > 0:
            rest_blocked = rest_wall - (cpu_step - covered_cpu) if cpu_step >= 0 else rest_wall
            exp = float(min(max(rest_blocked, 0), rest_comm))
            exposed_total += exp
            # attribute the remainder's exposed time by the dimensions' share of the whole step
            _split(exp, [c[k] for c in step_dim], dim_names, exposed_by_dim)
        for di, d in enumerate(dim_names):
            dim_total[d].append(float(step_dim[di][k]))
            dim_exposed[d].append(exposed_by_dim[d])
            dim_count[d].append(cnt_dim[di][k])
            dim_bytes[d].append(bytes_dim[di][k])

        # TP communication inside forward/backward
        fb_total = 0
        tp_in = 0.0
        for i in ph_k:
            if p_is_fb[i]:
                fb_total += p_dur[i]
                tp_in += fb_tp[fb_w]
                fb_w += 1
        fb_time.append(float(fb_total))
        tp_fb_comm.append(tp_in)

        # pipeline bubble of this stage
        chunks_i = [i for i in ph_k if p_is_chunk[i]]
        if chunks_i:
            cs_ = np.asarray([p_start[i] for i in chunks_i], dtype=np.int64)
            ce_ = cs_ + np.asarray([p_dur[i] for i in chunks_i], dtype=np.int64)
            lo_w, hi_w = t0, t1
            best = -1
            for i in ph_k:
                if p_depth[i] != 1:
                    continue
                lo = p_start[i]
                hi = lo + p_dur[i]
                ov = clipped_total(cs_, ce_, lo, hi)
                if ov > best and names[p_nm[i]] not in PIPELINE_CHUNKS:
                    best, lo_w, hi_w = ov, lo, hi
            window = hi_w - lo_w
            if window > 0:
                bubbles.append(1.0 - clipped_total(cs_, ce_, lo_w, hi_w) / window)

        rows.append(
            StepRow(
                step=s_no,
                duration_ns=dur,
                cpu_ns=cpu_step,
                comm_ns=int(comm_total),
                exposed_comm_ns=int(exposed_total),
                compute_ns=dur - int(exposed_total),
                tokens=tok,
                samples=smp,
            )
        )

    durations = [r.duration_ns for r in rows]
    step_dist = Distribution.of(durations)
    mean_step = step_dist.mean_ns if rows else math.nan
    total_time_s = sum(durations) / 1e9
    tokens = sum(r.tokens for r in rows)
    samples = sum(r.samples for r in rows)

    def share(x: float) -> float:
        return float(x / mean_step) if rows and mean_step > 0 else 0.0

    phase_stats = [
        PhaseStats(name=n, time=Distribution.of(v), share_of_step=share(float(np.mean(v))))
        for n, v in phase_totals.items()
    ]
    phase_stats.sort(key=lambda p: -p.time.mean_ns)

    comm_stats = []
    for d in dim_names:
        tot = float(np.mean(dim_total[d])) if rows else 0.0
        exp = float(np.mean(dim_exposed[d])) if rows else 0.0
        comm_stats.append(
            CommDimStats(
                dimension=d,
                count=round(np.mean(dim_count[d])) if rows else 0,
                bytes=int(np.mean(dim_bytes[d])) if rows else 0,
                total_ns=tot,
                exposed_ns=exp,
                hidden_ns=max(tot - exp, 0.0),
                total_share=share(tot),
                exposed_share=share(exp),
            )
        )
    comm_total_share = share(float(np.mean([r.comm_ns for r in rows]))) if rows else 0.0
    comm_exposed_share = share(float(np.mean([r.exposed_comm_ns for r in rows]))) if rows else 0.0
    data_share = share(float(np.mean(data_time))) if rows else 0.0

    dp_eff: float | None = None
    if (layout is not None and layout.dp > 1) or any(d == "dp" for d in dim_names):
        dp_exp = next((c.exposed_share for c in comm_stats if c.dimension == "dp"), 0.0)
        dp_eff = 1.0 - dp_exp
    tp_eff: float | None = None
    if (layout is not None and layout.tp > 1) or any(d == "tp" for d in dim_names):
        fb_sum = sum(fb_time)
        tp_eff = 1.0 - (sum(tp_fb_comm) / fb_sum) if fb_sum > 0 else None

    pipeline: PipelineStats | None = None
    if bubbles:
        p = layout.pp if layout is not None else 0
        m = microbatches
        theory = pipeline_bubble_theory(schedule, p, m, virtual_stages)
        bubble = float(np.mean(bubbles))
        pipeline = PipelineStats(
            schedule=schedule or "unknown",
            stages=p,
            microbatches=m,
            virtual_stages=virtual_stages,
            bubble=bubble,
            bubble_theory=theory,
            utilization=1.0 - bubble,
        )

    mem = _memory_stats(memory, {r.step for r in rows})
    flops = None
    if flops_per_step and rows and mean_step > 0:
        achieved, m_fu = mfu(flops_per_step, mean_step / 1e9, peak_tflops)
        flops = FlopsStats(float(flops_per_step), achieved, peak_tflops, m_fu)

    bottlenecks: list[Bottleneck] = []
    if rows:
        by_dim = {c.dimension: c.exposed_share for c in comm_stats}
        for b in (
            rule_exposed_comm(comm_exposed_share, by_dim, th),
            rule_memory(mem.peak_fraction, mem.peak_bytes, mem.capacity_bytes, th) if mem else None,
            rule_pipeline(
                pipeline.utilization,
                pipeline.bubble,
                pipeline.bubble_theory,
                pipeline.stages,
                pipeline.microbatches,
                th,
            )
            if pipeline
            else None,
            rule_tp(tp_eff, th) if tp_eff is not None else None,
            rule_data_loading(data_share, th),
        ):
            if b is not None:
                bottlenecks.append(b)
    order = {"critical": 0, "high": 1, "medium": 2, "low": 3}
    bottlenecks.sort(key=lambda b: order.get(b.severity, 9))

    return StepAnalysis(
        rank=rank,
        steps=len(rows),
        warmup_steps=warm,
        step_time=step_dist,
        tokens_per_s=tokens / total_time_s if total_time_s > 0 else 0.0,
        samples_per_s=samples / total_time_s if total_time_s > 0 else 0.0,
        phases=phase_stats,
        comm=comm_stats,
        comm_total_share=comm_total_share,
        comm_exposed_share=comm_exposed_share,
        data_loading_share=data_share,
        dp_efficiency=dp_eff,
        tp_efficiency=tp_eff,
        pipeline=pipeline,
        memory=mem,
        flops=flops,
        bottlenecks=bottlenecks,
        per_step=rows,
    )


def _split(amount: float, per_dim: list[int], dim_names: list[str], out: dict[str, float]) -> None:
    """Add ``amount`` to ``out`` split by each dimension's communication inside the window
    (``per_dim[i]``: dimension ``dim_names[i]``'s union length there, ns)."""
    if amount <= 0 or not dim_names:
        return
    tot = sum(per_dim)
    if tot <= 0:
        return
    for d, v in zip(dim_names, per_dim, strict=True):
        out[d] += amount * v / tot


def pipeline_bubble_theory(schedule: str, p: int, m: int, v: int = 1) -> float | None:
    """Theoretical bubble fraction: (p−1)/(m+p−1) for GPipe and 1F1B, (p−1)/(v·m+p−1) for
    interleaved 1F1B; None for schedules without a closed form here (zero-bubble variants)."""
    if p <= 1 or m <= 0:
        return None
    s = schedule.lower().replace("_", "").replace("-", "")
    if "interleaved1f1b" in s or (s.startswith("interleaved") and "zero" not in s):
        return (p - 1) / (v * m + p - 1)
    if (
        s in ("gpipe", "schedulegpipe", "1f1b", "schedule1f1b", "loopedbfs", "scheduleloopedbfs")
        or s == ""
    ):
        return (p - 1) / (m + p - 1)
    return None


def _memory_stats(memory: np.ndarray, steps: set[int]) -> MemoryStats | None:
    if len(memory) == 0:
        return None
    mem = memory[np.isin(memory["step"], list(steps))] if steps else memory
    if len(mem) == 0:
        mem = memory
    alloc = mem["allocated"].astype(np.int64)
    peak = int(max(mem["peak"].max(), alloc.max()))
    cap = int(mem["capacity"][-1])
    is_cpu = bool((mem["allocated"] == mem["rss"]).all())
    mean = float(alloc.mean())
    return MemoryStats(
        kind="cpu" if is_cpu else "cuda",
        current_bytes=int(alloc[-1]),
        peak_bytes=peak,
        mean_bytes=mean,
        mean_over_peak=mean / peak if peak > 0 else 0.0,
        capacity_bytes=cap,
        headroom_bytes=cap - peak if cap > 0 else -1,
        peak_fraction=peak / cap if cap > 0 else 0.0,
    )
