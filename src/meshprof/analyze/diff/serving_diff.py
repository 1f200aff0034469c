"""Two serving runs compared (``meshprof diff``'s ``serving``): the request figures, the steps
and their communication, and the decode stragglers that appeared, vanished or changed what they
cost. Every delta is B − A; times in ns, rates per second, shares as fractions."""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshprof.analyze.diff.relative import relative
from meshprof.analyze.serve.types import ServingReport

HEADLINE_MIN_REL = 0.05
"""A serving figure enters the diff's headline when it changed by at least this share."""
COST_CHANGE_RATIO = 2.0
"""A decode straggler named in both runs is listed as changed when what it costs the TPOT p50
grew or shrank by this factor or more (and by at least :data:`HEADLINE_MIN_REL` of A's TPOT
p50)."""


@dataclass(frozen=True, slots=True)
class ServingFigureDiff:
    """One serving figure in both runs."""

    figure: str
    """E.g. "TTFT p50", "TPOT p99", "goodput", "decode step p50", "decode comm share tp"."""
    unit: str
    """"ns", "1/s" or "fraction"."""
    a: float
    """Run A (NaN when it has no such figure)."""
    b: float
    """Run B."""
    delta: float
    """B − A."""
    rel: float
    """delta / A (NaN when A is not positive or a value is missing)."""


@dataclass(frozen=True, slots=True)
class StragglerChange:
    """A decode straggler of both runs whose cost to the requests changed (by
    :data:`COST_CHANGE_RATIO` or more): a fault that grew on a rank that was already slower than
    its peers is no new finding, and would otherwise go unsaid."""

    rank: int
    """The rank."""
    a_tpot_cost_ns: float
    """What it cost run A's TPOT p50: the p50 minus the p50 were the rank as fast as its peers."""
    b_tpot_cost_ns: float
    """The same in run B."""


@dataclass(frozen=True, slots=True)
class ServingDiff:
    """What changed in serving from run A to run B."""

    figures: tuple[ServingFigureDiff, ...]
    """Request latencies (p50 and p99), rates, error rate, goodput, steps by kind and the decode
    steps' communication, in that order."""
    a_requests: int
    """Requests recorded in A."""
    b_requests: int
    """Requests recorded in B."""
    appeared: tuple[str, ...] = ()
    """Serving findings of B that A did not have (their titles; decode stragglers by rank)."""
    vanished: tuple[str, ...] = ()
    """Serving findings of A that B does not have."""
    changed: tuple[StragglerChange, ...] = ()
    """Decode stragglers of both runs whose cost changed, largest change first."""
    note: str = ""
    """Why it could not be compared (only one run served requests)."""


def _fig(figure: str, unit: str, a: float, b: float) -> ServingFigureDiff:
    delta = b - a
    return ServingFigureDiff(figure, unit, a, b, delta, relative(delta, a))


def _key(f: object) -> str:
    """What a finding is about, across runs (its kind and ranks)."""
    return f"{getattr(f, 'kind', '')}:{getattr(f, 'ranks', ())}"


def serving_diff(a: ServingReport | None, b: ServingReport | None) -> ServingDiff | None:
    """The comparison (None when neither run served requests)."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        which = "A" if a is not None else "B"
        return ServingDiff(
            (),
            a.latencies.requests if a is not None else 0,
            b.latencies.requests if b is not None else 0,
            note=f"only {which} served requests: serving not compared",
        )
    la, lb = a.latencies, b.latencies
    figs = []
    for name, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E", "e2e"),
                      ("queue", "queue")):  # fmt: skip
        for q in (50, 99):
            figs.append(_fig(f"{name} p{q}", "ns", getattr(la, key).at(q), getattr(lb, key).at(q)))
    figs.append(_fig("requests/s", "1/s", la.request_rate, lb.request_rate))
    figs.append(_fig("output tokens/s", "1/s", la.output_tokens_per_s, lb.output_tokens_per_s))
    figs.append(_fig("error rate", "fraction", la.error_rate, lb.error_rate))
    if la.goodput is not None and lb.goodput is not None:
        figs.append(_fig("goodput", "1/s", la.goodput.per_s, lb.goodput.per_s))
        figs.append(
            _fig("SLO attainment", "fraction", la.goodput.attainment, lb.goodput.attainment)
        )
    ka = {k.kind: k for k in a.kinds}
    for k in b.kinds:
        if k.kind in ka:
            figs.append(_fig(f"{k.kind} step p50", "ns", ka[k.kind].step.p50, k.step.p50))
    da = dict(a.dims)
    for kind, shares in b.dims:
        sa = {d.dim: d for d in da.get(kind, ())}
        for d in shares:
            if d.dim in sa:
                figs.append(
                    _fig(f"{kind} comm share {d.dim}", "fraction", sa[d.dim].share, d.share)
                )
                figs.append(
                    _fig(f"{kind} wait share {d.dim}", "fraction", sa[d.dim].wait_share,
                         d.wait_share)
                )  # fmt: skip
    fa = {_key(f): f.title for f in a.findings if str(f.kind) == "decode_straggler"}
    fb = {_key(f): f.title for f in b.findings if str(f.kind) == "decode_straggler"}
    return ServingDiff(
        tuple(figs),
        la.requests,
        lb.requests,
        appeared=tuple(t for k, t in fb.items() if k not in fa),
        vanished=tuple(t for k, t in fa.items() if k not in fb),
        changed=_changed(a, b),
    )


def _tpot_costs(r: ServingReport) -> dict[int, float]:
    """Per rank named a decode straggler (alone): what it costs the TPOT p50 (ns)."""
    return {
        f.ranks[0]: float(f.value)
        for f in r.findings
        if str(f.kind) == "decode_straggler" and len(f.ranks) == 1 and math.isfinite(f.value)
    }


def _changed(a: ServingReport, b: ServingReport) -> tuple[StragglerChange, ...]:
    """The decode stragglers of both runs whose cost changed (:data:`COST_CHANGE_RATIO`)."""
    ca, cb = _tpot_costs(a), _tpot_costs(b)
    floor = HEADLINE_MIN_REL * a.latencies.tpot.at(50)
    out = []
    for rank in sorted(ca.keys() & cb.keys()):
        lo, hi = sorted((ca[rank], cb[rank]))
        if hi - lo >= floor and hi >= COST_CHANGE_RATIO * max(lo, 0.0):
            out.append(StragglerChange(rank, ca[rank], cb[rank]))
    return tuple(sorted(out, key=lambda c: -abs(c.b_tpot_cost_ns - c.a_tpot_cost_ns)))


def headline_rows(d: ServingDiff | None) -> list[ServingFigureDiff]:
    """The serving figures that changed by :data:`HEADLINE_MIN_REL` or more (for the diff's
    headline), largest relative change first."""
    if d is None:
        return []
    rows = [f for f in d.figures if math.isfinite(f.rel) and abs(f.rel) >= HEADLINE_MIN_REL]
    return sorted(rows, key=lambda f: -abs(f.rel))


__all__ = [
    "COST_CHANGE_RATIO",
    "HEADLINE_MIN_REL",
    "ServingDiff",
    "ServingFigureDiff",
    "StragglerChange",
    "headline_rows",
    "serving_diff",
]
