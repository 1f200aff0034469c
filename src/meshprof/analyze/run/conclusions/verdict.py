"""The verdict: the causes of lost time of the run, each with what it costs, the evidence and
the next thing to try — the report's first answer, largest cost first.

Causes and their cost per step (ns; its share is of the step time ``step_ns``):

* **a straggler** — each rank the what-if names (:attr:`meshprof.analyze.run.what_if.what_if.WhatIf.
  notable`): how much shorter every step would be if it computed like its peers (the replay's
  saving; it includes everybody's waiting for it);
* **exposed communication of a dimension**, **the pipeline bubble**, **data loading**, **the
  optimizer step and checkpoints**, **unattributed time** — the time ledger's part
  (:mod:`meshprof.analyze.run.conclusions.ledger`) per rank and step;
* **waiting for late ranks** — the ledger's straggler wait, attributed to the ranks the others
  waited for (from the arrivals: :mod:`meshprof.analyze.run.stragglers.waits`), whether or not the what-if
  could price their excess (a rank it prices is also a straggler cause above: the two overlap,
  the straggler's saving includes everybody's waiting for it).

Every cause, the ledger's parts included, is listed when its share is at least
:data:`MIN_SHARE` (``include_small``: all): the verdict never hides what the ledger shows. Its
device-hours are its cost per step × the steps recorded × the ranks of the job: the time every
device of the job spent on it, named for what the job computed on (:attr:`VerdictInputs.device`:
GPU-hours on GPUs, CPU-hours — hours of a rank's process, not of a core — on a CPU job); with a
price per device-hour, its money. Deterministic: the same report gives the same verdict.

What to do about exposed data- and tensor-parallel communication depends on the job
(:attr:`VerdictInputs.workload`): gradient advice only when it trains (an optimizer stepped, a
backward ran); a forward-only job is told what helps a forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshprof.analyze.compute.workload import Workload
from meshprof.analyze.run.conclusions.ledger import CARVED, Ledger
from meshprof.analyze.run.stragglers.stragglers import StragglerReport
from meshprof.analyze.run.stragglers.waits import WaitCause
from meshprof.analyze.run.what_if.what_if import WhatIf
from meshprof.records.ledger import TimeCause

MIN_SHARE = 0.02
"""Causes below this share of the step are left out (unless asked for)."""
CULPRIT_FAIR = 2.0
"""The rank the others waited for most is named in the straggler-wait cause when it was the
last to arrive for at least this many times its fair share of the run's waiting (1 / ranks),
with the next ones (at most three) whose share is at least :data:`CULPRIT_NEAR` of its."""
CULPRIT_NEAR = 0.75

NS_PER_HOUR = 3_600 * 10**9

_ACTIONS = {
    TimeCause.EXPOSED_DP: "overlap the gradient reduction with backward (DDP buckets, FSDP2 "
    "prefetch), accumulate more micro-batches, or compress gradients",
    TimeCause.EXPOSED_TP: "keep TP groups inside a node, lower the TP degree, or overlap TP "
    "communication (async TP, sequence parallel)",
    TimeCause.EXPOSED_PP: "more micro-batches or an interleaved schedule, so sends and receives "
    "hide behind compute",
    TimeCause.EXPOSED_OTHER: "batch the step's world-group collectives (grad norm, metrics, "
    "barriers) or move them off the step",
    TimeCause.BUBBLE: "more micro-batches per step (m ≥ 4·p), an interleaved 1F1B schedule, or "
    "stages of balanced layers",
    TimeCause.STRAGGLER_WAIT: "no single rank holds the others up: see who they wait for "
    "(wait_causes) and the skew per group (jitter, noisy hosts)",
    TimeCause.DATA_LOADING: "more DataLoader workers, pin_memory and prefetch, or preprocessing "
    "out of the training loop",
    TimeCause.OPTIMIZER: "a fused (foreach) optimizer; checkpoints saved asynchronously or less "
    "often",
    TimeCause.IDLE: "wrap the step's code in phases (StepMonitor.phase) to see where this goes",
}
"""The next thing to try for each ledger cause (in a training job)."""

_ACTIONS_NOT_TRAINING = {
    TimeCause.EXPOSED_DP: "overlap the data-parallel collectives with compute (issue them "
    "asynchronously and early, bucket small ones) or send less: fewer, larger collectives",
    TimeCause.EXPOSED_TP: "nothing to hide TP collectives behind in a forward-only job: keep the "
    "TP group inside a node, lower the TP degree and serve more replicas, or batch more requests "
    "per forward so each all-reduce's latency is shared",
}
"""The same where the job computes no gradients (inference, or nothing says it trains)."""

_TITLES = {
    TimeCause.EXPOSED_DP: "exposed data-parallel communication",
    TimeCause.EXPOSED_TP: "exposed tensor-parallel communication",
    TimeCause.EXPOSED_PP: "exposed pipeline communication",
    TimeCause.EXPOSED_OTHER: "exposed communication of other groups",
    TimeCause.BUBBLE: "pipeline bubble",
    TimeCause.STRAGGLER_WAIT: "waiting for late ranks",
    TimeCause.DATA_LOADING: "data loading",
    TimeCause.OPTIMIZER: "optimizer step and checkpoints",
    TimeCause.IDLE: "time outside the recorded phases",
}


@dataclass(frozen=True, slots=True)
class VerdictItem:
    """One cause of lost time."""

    cause: str
    """``straggler``, or a :class:`~meshprof.records.ledger.TimeCause` value."""
    title: str
    """What it is, for people ("rank 37 computes longer than its peers")."""
    ns_per_step: float
    """What it costs every step (ns)."""
    share_of_step: float
    """ns_per_step / the step time (fraction)."""
    device_hours: float
    """What it cost over the recorded steps, on every device (rank) of the job (hours)."""
    device: str
    """What the hours are of: ``"GPU"``, ``"CPU"`` (a rank's process on a CPU job), or
    ``"device"`` when the run does not say (:func:`meshprof.rundir.job_device_kind`)."""
    gpu_hours: float
    """``device_hours`` under its name of earlier versions (kept for their readers; CPU-hours
    on a CPU job, see ``device``)."""
    money: float | None
    """device_hours × the price per device-hour given (None without one)."""
    ranks: tuple[int, ...]
    """The ranks it is about (empty: all)."""
    since_step: int | None
    """The first step it was seen in (the first analysed step)."""
    evidence: str
    """The figures behind it, in words."""
    action: str
    """The next thing to try."""


@dataclass(frozen=True, slots=True)
class VerdictInputs:
    """What the verdict reads: sections of the report."""

    what_if: WhatIf | None
    """The what-if replay."""
    ledger: Ledger
    """The time ledger."""
    stragglers: StragglerReport
    """The straggler report (scores, phases)."""
    world_size: int
    """Ranks (devices) of the job."""
    hosts: dict[int, str]
    """Rank -> host name, for the evidence."""
    wait_causes: tuple[WaitCause, ...] = ()
    """Who the others waited for (:mod:`meshprof.analyze.run.stragglers.waits`)."""
    workload: Workload = Workload.UNKNOWN
    """Whether the job trains (:func:`meshprof.analyze.compute.workload.job_workload`):
    gradient advice only for a training job."""
    device: str = "device"
    """What the job computed on: ``"GPU"``, ``"CPU"`` or ``"device"`` (unknown)."""
    not_read: tuple[tuple[int, int], ...] = ()
    """Ranks of the job on nodes whose run directories were not read, as (first, last) spans:
    the others' waiting for them cannot be told from communication (their arrivals are not
    here), so it stays in the exposed communication, which then says so."""


def verdict(
    v: VerdictInputs, *, gpu_hour_price: float | None = None, include_small: bool = False
) -> tuple[VerdictItem, ...]:
    """The causes of lost time, largest first; ``gpu_hour_price``: the price of one
    device-hour (a GPU-hour, or a CPU-hour on a CPU job)."""
    led, s = v.ledger, v.stragglers
    rank_steps = led.steps
    wall_per_step = led.job.wall_ns / rank_steps if rank_steps else 0.0
    step_ns = (
        v.what_if.step_ns if v.what_if is not None and v.what_if.step_ns > 0 else wall_per_step
    )
    steps_run = len(s.steps)
    devices = max(v.world_size, len(led.ranks), 1)
    actions = dict(_ACTIONS)
    if v.workload is not Workload.TRAINING:
        actions.update(_ACTIONS_NOT_TRAINING)
    since = s.common_steps[0] if s.common_steps else (s.steps[0] if s.steps else None)
    floor = 0.0 if include_small else MIN_SHARE

    def item(
        cause: str,
        title: str,
        ns: float,
        ranks: tuple[int, ...],
        ev: str,
        act: str,
        share: float | None = None,
    ) -> VerdictItem:
        hours = ns * steps_run * devices / NS_PER_HOUR
        return VerdictItem(
            cause=cause,
            title=title,
            ns_per_step=ns,
            share_of_step=share if share is not None else (ns / step_ns if step_ns > 0 else 0.0),
            device_hours=hours,
            device=v.device,
            gpu_hours=hours,
            money=hours * gpu_hour_price if gpu_hour_price is not None else None,
            ranks=ranks,
            since_step=since,
            evidence=ev,
            action=act,
        )

    out: list[VerdictItem] = []
    named = {x.rank: x for x in s.stragglers}
    notable = v.what_if.notable if v.what_if is not None else ()
    if v.what_if is not None:
        for c in notable:
            x = named.get(c.rank)
            phase = f" in {c.phase}" if c.phase else ""
            host = v.hosts.get(c.rank, "")
            ev = f"{c.excess_ns / 1e6:.2f} ms more compute per step than its peers{phase}"
            if x is not None:
                ev += f"; {x.score:+.0%} compute vs the median rank, arrived last in {x.last_share:.0%} of its collectives"
            act = (
                f"look at rank {c.rank}{f' ({host})' if host else ''}{phase}: device clocks and "
                "heat, its data (sequence lengths), other processes"
            )
            out.append(item("straggler", f"rank {c.rank} computes longer than its peers",
                            c.step_saving_ns, (c.rank,), ev, act))  # fmt: skip
    per_step = {k: (n / rank_steps if rank_steps else 0.0) for k, n in led.job.parts.items()}
    for cause in TimeCause:
        if cause is TimeCause.COMPUTE:
            continue
        ns = per_step.get(cause.value, 0.0)
        if ns <= 0:
            continue
        share = led.job.parts[cause.value] / led.job.wall_ns if led.job.wall_ns else 0.0
        worst = max(led.ranks, key=lambda r: r.parts[cause.value] / max(r.wall_ns, 1))
        worst_share = worst.parts[cause.value] / max(worst.wall_ns, 1)
        ev = f"{share:.1%} of the job's {v.device} time; most on rank {worst.rank} ({worst_share:.1%})"
        ranks: tuple[int, ...] = ()
        title, act = _TITLES[cause], actions[cause]
        if cause is TimeCause.STRAGGLER_WAIT and v.wait_causes:
            title, ranks, more, act = _waited_for(v, {c.rank for c in notable})
            ev += more
        elif cause in CARVED and v.not_read:
            who = _spans_text(v.not_read)
            ev += (
                f"; {who} ran on other nodes, whose run directories were not read: waiting "
                "for them cannot be told from communication and counts here"
            )
            act = (
                "read every node's directory (meshprof report DIR1 DIR2 ..., or meshprof "
                f"collect) to tell waiting for {who} from communication; then {act}"
            )
        out.append(item(cause.value, title, ns, ranks, ev, act, share))
    kept = [x for x in out if x.share_of_step >= floor]
    kept.sort(key=lambda x: (-x.ns_per_step, x.cause, x.ranks))
    return tuple(kept)


def _spans_text(spans: tuple[tuple[int, int], ...], most: int = 4) -> str:
    """``rank 3`` or ``ranks 4–7, 9`` (the first ``most`` spans, then how many more)."""
    count = sum(last - first + 1 for first, last in spans)
    parts = [str(a) if a == b else f"{a}–{b}" for a, b in spans[:most]]
    more = f" and {len(spans) - most:,} more spans" if len(spans) > most else ""
    return ("rank " if count == 1 else "ranks ") + ", ".join(parts) + more


def _waited_for(v: VerdictInputs, priced: set[int]) -> tuple[str, tuple[int, ...], str, str]:
    """The straggler wait's title, ranks, evidence (appended) and action: the ranks the others
    waited for (from the arrivals; see :data:`CULPRIT_FAIR`), with what the what-if says of
    each (``priced``: the ranks it calls out)."""
    top = v.wait_causes[0]
    fair = 1.0 / max(v.world_size, len(v.ledger.ranks), 1)
    culprits = (
        [c for c in v.wait_causes if c.share >= CULPRIT_NEAR * top.share][:3]
        if top.share >= CULPRIT_FAIR * fair
        else []
    )
    ev = f"; rank {top.rank} was the last to arrive for {top.share:.0%} of the waiting"
    if top.group:
        ev += f" (most in {top.group})"
    if not culprits:
        return _TITLES[TimeCause.STRAGGLER_WAIT], (), ev, _ACTIONS[TimeCause.STRAGGLER_WAIT]
    ranks = tuple(c.rank for c in culprits)
    w = v.what_if
    for c in culprits:
        if c.rank in priced:
            ev += f"; rank {c.rank}'s cost is priced above (its saving includes this waiting)"
        elif w is not None and w.doubt:
            ev += f"; the what-if cannot price rank {c.rank}'s excess: {w.doubt}"
        elif w is not None and c.rank in w.unmeasured:
            ev += f"; the what-if cannot price rank {c.rank}'s excess: it has no peers"
        else:
            ev += f"; the what-if finds no excess compute of rank {c.rank} that it can price"
    who = ", ".join(str(r) for r in ranks)
    hosts = [v.hosts.get(r, "") for r in ranks]
    on = f" ({', '.join(h for h in hosts if h)})" if any(hosts) else ""
    title = f"waiting for late ranks: rank{'s' if len(ranks) > 1 else ''} {who}"
    act = (
        f"look at rank{'s' if len(ranks) > 1 else ''} {who}{on}: what they do before the "
        "collectives the others wait in (their compute, data, host), then the skew per group"
    )
    return title, ranks, ev, act


__all__ = ["CULPRIT_FAIR", "CULPRIT_NEAR", "MIN_SHARE", "VerdictInputs", "VerdictItem", "verdict"]
