"""meshprof's conclusions on a simulated job against the simulator's truth (the comparison, not
the truth: this module runs meshprof's report; :mod:`sim.jobsim` never does).

For one :class:`~sim.jobsim.Job`: simulate it, write its run directory, run the report, and
for each conclusion take the true figure from the simulator, re-running the same job with the
slow rank, group or dimension fixed:

- the what-if's costliest rank (group, dimension): is it the truly costliest one (its true
  saving within the tolerance of the largest), and is its saving within the tolerance of its
  true saving; no saving below minus the replay's stated error;
- the straggler finding: it names no rank that is not slow;
- exposed communication (per rank and step): the time the rank's program was blocked;
- the diff (optional) against the same job with every slow rank fixed: the step-time change
  and the slowest rank's compute change.

Tolerance: 10 % of the true figure or 20 µs, whichever is larger."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meshprof.analyze.diff.compare import diff_runs
from meshprof.analyze.run.what_if.what_if import NO_PEERS
from meshprof.report.analysis import analyze_run
from meshprof.report.diff_input import side_of
from meshprof.report.run_report import RunReport
from meshprof.report.stages.rank_analyses import RANK_ANALYSES
from meshprof.report.stages.stragglers import STRAGGLERS
from meshprof.report.stages.what_if import WHAT_IF_REPLAY
from meshprof.rundir import LoadedRun, load_run
from sim.jobsim import Fix, Job, Timeline, groups, simulate
from sim.write_rundir import write_run

REL_TOL = 0.10
ABS_TOL_NS = 20_000


def load_recorded(path: Path, flags: bool = True) -> LoadedRun:
    """Load a written run; ``flags=False``: as a record without the events' flags (an older
    file, a foreign trace: whether an op was issued async is unknown to the analysis)."""
    run = load_run(path)
    if not flags:
        for rd in run.ranks.values():
            names = [n for n in rd.events.dtype.names or () if n != "flags"]
            rd.events = rd.events[names].copy()
    return run


def within(got: float, want: float) -> bool:
    """|got − want| ≤ max(10 % of want, 20 µs)."""
    return abs(got - want) <= max(REL_TOL * abs(want), ABS_TOL_NS)


def saving(base: Timeline, fixed: Timeline) -> float:
    """The true saving: median over steps of the job's step-time difference (ns)."""
    return float(np.median(base.job_step_ns - fixed.job_step_ns))


def meshprof_dim(job: Job, name: str) -> str:
    """The dimension meshprof gives the group ``name`` (the world group takes the name of the
    only dimension of size > 1, when there is one)."""
    dims = [d for d, s in (("dp", job.dp), ("tp", job.tp), ("pp", job.pp)) if s > 1]
    g = next(x for x in groups(job) if x.name == name)
    if g.dim == "world" and len(dims) == 1:
        return dims[0]
    return g.dim


@dataclass
class Verdict:
    """One conclusion: what meshprof said and the truth."""

    said: str
    """What meshprof named (a rank, a group, a dimension), "" for nothing."""
    saving_ns: float
    truth_ns: float
    """The true saving of what meshprof named."""
    best: str
    """The truly costliest one."""
    best_ns: float
    ok: bool


@dataclass
class JobCheck:
    """Everything checked on one job."""

    job: Job
    step_ns: float
    """The job's true median step time (ns)."""
    rank: Verdict
    group: Verdict
    dim: Verdict
    min_saving_ns: float
    replay_error_ns: int
    note: str
    notable: tuple[int, ...]
    """Ranks the report calls out (significant and at least the minimum share)."""
    notable_ok: bool
    """Every called-out rank truly costs something, and a rank truly costing ≥ 5 % of the step
    is called out (or said to be unmeasured: it has no peers)."""
    stragglers: tuple[int, ...]
    stragglers_ok: bool
    """No named rank is not slow."""
    exposed_err: float
    """Largest |exposed − truly blocked| over ranks and analysed steps / the step time."""
    diff: dict[str, float] = field(default_factory=dict)
    diff_ok: bool = True
    seconds: float = 0.0

    @property
    def negative_ok(self) -> bool:
        return self.min_saving_ns >= -(self.replay_error_ns + ABS_TOL_NS)


def _verdict(said: str, got: float, truth: dict[str, float], cannot: bool = False) -> Verdict:
    """``cannot``: the report says it cannot measure the truly costliest one (it has no
    peers): right, as the issue asks ("the report says so instead of a wrong number")."""
    best = max(truth, key=lambda k: truth[k]) if truth else ""
    best_ns = truth.get(best, 0.0)
    if cannot:
        return Verdict("(not measured)", got, 0.0, best, best_ns, True)
    t = truth.get(said, 0.0)
    ok = within(got, t) and t >= best_ns - max(REL_TOL * best_ns, ABS_TOL_NS)
    return Verdict(said, got, t, best, best_ns, ok)


def check_job(job: Job, work: Path | None = None, diff: bool = False) -> JobCheck:
    """Run every check on ``job`` (run directories under ``work``, a temporary one by
    default, removed afterwards)."""
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="jobsim-", dir=work))
    try:
        return _check(job, tmp, diff, t0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check(job: Job, tmp: Path, diff: bool, t0: float) -> JobCheck:
    base = simulate(job)
    rep = analyze_run(load_run(write_run(tmp / "a", base)))
    w = rep[WHAT_IF_REPLAY]
    cache: dict[Fix, float] = {}

    def truth(fix: Fix) -> float:
        if fix not in cache:
            cache[fix] = saving(base, simulate(job, fix))
        return cache[fix]

    slow = {r for r, _ in job.slow}
    rank_truth = {str(r): truth(Fix(ranks=frozenset({r}))) for r in slow}
    have = {g.name: g for g in groups(job)}
    slow_groups = {g for g in have.values() if len(g.ranks) >= 2 and slow & set(g.ranks)}
    group_truth = {g.name: truth(Fix(groups=frozenset({g.name}))) for g in slow_groups}
    by_dim: dict[str, set[str]] = {}
    for g in have.values():
        if len(g.ranks) >= 2:
            by_dim.setdefault(meshprof_dim(job, g.name), set()).add(g.name)
    slow_dims = {meshprof_dim(job, g.name) for g in slow_groups}
    dim_truth = {d: truth(Fix(groups=frozenset(by_dim[d]))) for d in slow_dims}
    top_r = w.ranks[0] if w.ranks else None
    top_g = w.groups[0] if w.groups else None
    top_d = w.dims[0] if w.dims else None
    best_rank = max(rank_truth, key=lambda k: rank_truth[k]) if rank_truth else ""
    cannot = bool(best_rank) and (
        w.note == NO_PEERS or int(best_rank) in w.unmeasured or bool(w.doubt)
    )
    rank_v = _verdict(str(top_r.rank) if top_r else "", top_r.step_saving_ns if top_r else 0.0,
                      rank_truth, cannot)  # fmt: skip
    group_v = _verdict(top_g.group if top_g else "", top_g.step_saving_ns if top_g else 0.0,
                       group_truth, cannot)  # fmt: skip
    dim_v = _verdict(top_d.dim if top_d else "", top_d.step_saving_ns if top_d else 0.0,
                     dim_truth, cannot)  # fmt: skip
    savings = [c.step_saving_ns for c in (*w.ranks, *w.groups, *w.dims)]
    step_ns = float(np.median(base.job_step_ns))
    notable = tuple(c.rank for c in w.notable)
    clear = [r for r, v in rank_truth.items() if v >= 0.05 * step_ns]
    notable_ok = all(rank_truth.get(str(r), 0.0) > ABS_TOL_NS for r in notable) and all(
        int(r) in notable or int(r) in w.unmeasured or w.note == NO_PEERS for r in clear
    )
    named = tuple(s.rank for s in rep[STRAGGLERS].stragglers)
    err = 0.0
    for a in rep[RANK_ANALYSES]:
        for row in a.per_step:
            blocked = float(base.blocked[a.rank, row.step])
            err = max(err, abs(row.exposed_comm_ns - blocked) / step_ns)
    check = JobCheck(
        job=job,
        step_ns=step_ns,
        rank=rank_v,
        group=group_v,
        dim=dim_v,
        min_saving_ns=min(savings, default=0.0),
        replay_error_ns=w.replay_error_ns,
        note=w.note,
        notable=notable,
        notable_ok=notable_ok,
        stragglers=named,
        stragglers_ok=set(named) <= slow,
        exposed_err=err,
    )
    if diff and slow:
        check.diff, check.diff_ok = _diff(job, base, rep, tmp)
    check.seconds = time.perf_counter() - t0
    return check


def _diff(job: Job, base: Timeline, rep: RunReport, tmp: Path) -> tuple[dict[str, float], bool]:
    """meshprof diff between the job and the same job with every slow rank fixed, against the
    simulator's own figures: the median over ranks of each rank's median step time, and the
    slowest rank's median compute per step."""
    fixed = simulate(job, Fix(ranks=frozenset(r for r, _ in job.slow)))
    run_b = load_run(write_run(tmp / "b", fixed))
    rep_b = analyze_run(run_b)
    layout = run_b.layout()
    d = diff_runs(side_of(rep, layout), side_of(rep_b, layout))

    def step_med(tl: Timeline) -> float:
        return float(np.median(np.median(tl.step_end - tl.step_start, axis=1)))

    worst = max(job.slow, key=lambda x: x[1])[0]
    true_step = step_med(fixed) - step_med(base)
    true_compute = float(np.median(fixed.compute[worst]) - np.median(base.compute[worst]))
    got_step = d.step.delta_ns if d.step is not None else float("nan")
    row = next((x for x in d.ranks if x.rank == worst), None)
    got_compute = row.compute_delta_ns if row is not None else float("nan")
    out = {
        "step_delta_ns": got_step,
        "true_step_delta_ns": true_step,
        "compute_delta_ns": got_compute,
        "true_compute_delta_ns": true_compute,
    }
    return out, within(got_step, true_step) and within(got_compute, true_compute)
