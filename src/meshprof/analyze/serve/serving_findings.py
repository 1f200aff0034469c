"""The serving job's conclusions, most severe first (each a :class:`ServingFinding`).

- ``decode_straggler``: a rank whose compute in the decode steps exceeds its peers', named with
  the step it began at, when its replayed savings (:mod:`.request_savings`), of the TPOT p50
  and of the median decode step, are each at least :data:`MIN_TPOT_SHARE` of the TPOT p50:
  what the requests would gain were it as fast as its peers (warning);
- ``slo``: requests that missed the service levels given (warning below
  :data:`MIN_ATTAINMENT`, else info);
- ``serving_communication``: the decode steps' collectives per dimension, transfer and waiting
  for the last rank (warning when the wait is :data:`WAIT_SHARE` of the step or more);
- ``queueing``: requests waited longer for their prefill than it took (p50) (warning);
- ``request_errors``: requests finished with an error (warning).
"""

from __future__ import annotations

import datetime as _dt
import math

from meshprof.analyze.serve.types import (
    DimShare,
    RankCostToRequests,
    RequestLatencies,
    ServingFinding,
)
from meshprof.records.finding import FindingKind, Severity

MIN_TPOT_SHARE = 0.05
"""A rank is named in the findings when its TPOT p50 saving and its median decode step's
saving each reach this share of the TPOT p50: the training report's straggler bar (a score
above 5 %). At 2 % of the TPOT p50 alone, a run without any fault had rank 1 named on 2 shared
cores (0.5 ms of a 30 ms decode step; TPOT p50 32 → 31 ms), so a diff against a run with a real
150 ms straggler saw nothing appear."""
MIN_ATTAINMENT = 0.9
"""SLO attainment below this is a warning."""
WAIT_SHARE = 0.1
"""A wait for the last rank of this share of the decode step is a warning."""


def _ms(ns: float) -> str:
    if not math.isfinite(ns):
        return "n/a"
    return f"{ns / 1e6:.2f} ms" if abs(ns) < 1e7 else f"{ns / 1e6:.0f} ms"


def _clock(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9).strftime("%H:%M:%S") if ns > 0 else ""


def straggler_findings(
    costs: tuple[RankCostToRequests, ...], lat: RequestLatencies
) -> list[ServingFinding]:
    out = []
    for c in costs:
        saving = c.tpot_saving_ns
        base = c.tpot_p50_ns if math.isfinite(c.tpot_p50_ns) else lat.tpot.p50
        step = c.decode_step_saving_ns
        # both: the TPOT p50 of a few requests jumps to another request when the steps are
        # re-timed (0.23 ms a step moved it by 1.8 ms, 5.5 %, in a run without a fault); the
        # median decode step's saving is the rank's cost itself
        if not (
            math.isfinite(saving)
            and math.isfinite(step)
            and base > 0
            and saving >= MIN_TPOT_SHARE * base
            and step >= MIN_TPOT_SHARE * base
        ):
            continue
        when = _clock(c.since_ns)
        out.append(
            ServingFinding(
                kind=FindingKind.DECODE_STRAGGLER,
                severity=Severity.WARNING,
                title=(
                    f"rank {c.rank} is slow in decode compute since step {c.since_step}"
                    + (f" ({when})" if when else "")
                    + f": +{_ms(c.excess_ns)} per decode step over its peers; were it as fast, "
                    f"TPOT p50 {_ms(c.tpot_p50_ns)} → {_ms(c.tpot_p50_after_ns)}, TTFT p50 "
                    f"{_ms(c.ttft_p50_ns)} → {_ms(c.ttft_p50_after_ns)} "
                    f"({c.requests} requests)"
                ),
                ranks=(c.rank,),
                since_step=c.since_step,
                value=saving,
            )
        )
    return out


def slo_finding(lat: RequestLatencies) -> list[ServingFinding]:
    g = lat.goodput
    if g is None or not g.judged or g.good == g.judged:
        return []
    missed = ", ".join(f"{k} {v}" for k, v in g.missed.items() if v)
    return [
        ServingFinding(
            kind=FindingKind.SLO,
            severity=Severity.WARNING if g.attainment < MIN_ATTAINMENT else Severity.INFO,
            title=(
                f"{g.judged - g.good} of {g.judged} requests missed the service levels "
                f"({g.slo.text()}; missed: {missed}): goodput {g.per_s:.2f} requests/s, "
                f"{g.attainment:.0%} attainment"
            ),
            value=g.attainment,
        )
    ]


def comm_findings(dims: tuple[tuple[str, tuple[DimShare, ...]], ...]) -> list[ServingFinding]:
    out = []
    for kind, shares in dims:
        if kind != "decode" or not shares:
            continue
        parts = [
            f"{d.dim} {d.share:.0%} (transfer {(d.share - d.wait_share):.0%}, waiting for the "
            f"last rank {d.wait_share:.0%})"
            for d in shares
        ]
        wait = sum(d.wait_share for d in shares)
        out.append(
            ServingFinding(
                kind=FindingKind.SERVING_COMMUNICATION,
                severity=Severity.WARNING if wait >= WAIT_SHARE else Severity.INFO,
                title="decode steps' collectives: " + "; ".join(parts),
                value=wait,
            )
        )
    return out


def queue_finding(lat: RequestLatencies) -> list[ServingFinding]:
    q, p = lat.queue.p50, lat.prefill.p50
    if not (math.isfinite(q) and math.isfinite(p)) or q <= p:
        return []
    return [
        ServingFinding(
            kind=FindingKind.QUEUEING,
            severity=Severity.WARNING,
            title=(
                f"requests waited {_ms(q)} (p50; p99 {_ms(lat.queue.p99)}) for their prefill, "
                f"which took {_ms(p)}: the server is saturated (add replicas, or batch more "
                "prompts per prefill)"
            ),
            value=q,
        )
    ]


def error_finding(lat: RequestLatencies) -> list[ServingFinding]:
    n = lat.reasons.get("error", 0)
    if not n:
        return []
    return [
        ServingFinding(
            kind=FindingKind.REQUEST_ERRORS,
            severity=Severity.WARNING,
            title=f"{n} requests finished with an error ({lat.error_rate:.1%} of those finished)",
            value=lat.error_rate,
        )
    ]


def serving_findings(
    lat: RequestLatencies,
    costs: tuple[RankCostToRequests, ...],
    dims: tuple[tuple[str, tuple[DimShare, ...]], ...],
) -> tuple[ServingFinding, ...]:
    """Every finding of the module docstring, most severe first."""
    got = [
        *straggler_findings(costs, lat),
        *error_finding(lat),
        *slo_finding(lat),
        *queue_finding(lat),
        *comm_findings(dims),
    ]
    return tuple(sorted(got, key=lambda f: f.severity.order))


__all__ = ["MIN_ATTAINMENT", "MIN_TPOT_SHARE", "WAIT_SHARE", "serving_findings"]
