"""Request latencies, throughput and goodput, with ``vllm bench serve``'s definitions.

The latency figures are over the successful requests (finished with ``stop`` or ``length``);
ITL is every gap between two consecutive token emissions of those requests. The duration of the
rates is the first arrival to the last finish of the finished requests (the benchmark duration).
A request is *good* when every figure the service levels bound is at or under its bound
(``vllm bench serve --goodput``); a request of one output token has no TPOT and meets a TPOT
bound (bench serve counts its TPOT as 0); goodput = good requests / duration.
"""

from __future__ import annotations

import math

import numpy as np

from meshprof.analyze.serve.request_table import RequestTable
from meshprof.analyze.serve.types import Goodput, Histogram, LatencyStats, RequestLatencies
from meshprof.events import FINISH_CODES, FINISH_REASONS
from meshprof.records.serving import SLO_NAMES, ServiceLevels

HIST_BINS = 30
"""Bins of a drawn distribution (log-spaced between its smallest and largest value)."""


def histogram(name: str, values: np.ndarray, bins: int = HIST_BINS) -> Histogram:
    """The distribution of the finite positive ``values`` in ``bins`` log-spaced bins."""
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a) & (a > 0)]
    if not len(a):
        return Histogram(name, (), ())
    lo, hi = float(a.min()), float(a.max())
    if hi <= lo:
        hi = lo * 1.01 + 1.0
    edges = np.geomspace(lo, hi, bins + 1)
    counts, _ = np.histogram(a, edges)
    return Histogram(name, tuple(edges.tolist()), tuple(int(c) for c in counts))


def good_requests(table: RequestTable, slo: ServiceLevels) -> tuple[np.ndarray, dict[str, int]]:
    """(bool per request: successful and within every bound, misses per bounded figure)."""
    ok = table.ok
    good = ok.copy()
    missed: dict[str, int] = {}
    figures = {
        "ttft": table.ttft_ns,
        "tpot": np.nan_to_num(table.tpot_ns, nan=0.0),
        "itl": np.nan_to_num(table.max_gap_ns(), nan=0.0),
        "e2e": table.e2e_ns,
    }
    for name in SLO_NAMES:
        bound = getattr(slo, f"{name}_s")
        if bound is None:
            continue
        v = figures[name]
        within = np.isfinite(v) & (v <= bound * 1e9)
        missed[name] = int((ok & ~within).sum())
        good &= within
    return good, missed


def request_latencies(table: RequestTable, slo: ServiceLevels | None = None) -> RequestLatencies:
    """The request figures of ``table`` (see the module docstring)."""
    rows = table.rows
    ok = table.ok
    reason = rows["reason"]
    unfinished = int((reason == FINISH_CODES["unfinished"]).sum())
    reasons = {
        name: int((reason == code).sum())
        for code, name in enumerate(FINISH_REASONS)
        if name != "unfinished"
    }
    finished = len(rows) - unfinished
    done = reason != FINISH_CODES["unfinished"]
    if done.any():
        duration = float(rows["finished_ns"][done].max() - rows["arrival_ns"][done].min())
    else:
        duration = math.nan
    per_s = 1e9 / duration if duration > 0 else math.nan
    out_tokens = rows["output_tokens"][ok].astype(np.int64)
    in_tokens = rows["prompt_tokens"][ok].astype(np.int64)
    gap, gap_req = table.gaps()
    gap = gap[ok[gap_req]] if len(gap) else gap
    good: Goodput | None = None
    if slo is not None and not slo.empty:
        g, missed = good_requests(table, slo)
        n_good, judged = int(g.sum()), int(ok.sum())
        good = Goodput(
            slo=slo,
            good=n_good,
            judged=judged,
            per_s=n_good * per_s if math.isfinite(per_s) else math.nan,
            attainment=n_good / judged if judged else math.nan,
            missed=missed,
        )
    ttft, tpot, e2e = table.ttft_ns[ok], table.tpot_ns[ok], table.e2e_ns[ok]
    return RequestLatencies(
        rank=table.rank,
        ranks_with_requests=table.ranks_with_requests,
        requests=len(rows),
        successful=int(ok.sum()),
        unfinished=unfinished,
        reasons=reasons,
        error_rate=reasons["error"] / finished if finished else 0.0,
        duration_ns=duration,
        request_rate=int(ok.sum()) * per_s if math.isfinite(per_s) else math.nan,
        output_tokens_per_s=float(out_tokens.sum()) * per_s if math.isfinite(per_s) else math.nan,
        total_tokens_per_s=(
            float(out_tokens.sum() + in_tokens.sum()) * per_s if math.isfinite(per_s) else math.nan
        ),
        prompt_tokens=LatencyStats.of(in_tokens),
        output_tokens=LatencyStats.of(out_tokens),
        ttft=LatencyStats.of(ttft),
        tpot=LatencyStats.of(tpot),
        itl=LatencyStats.of(gap),
        e2e=LatencyStats.of(e2e),
        queue=LatencyStats.of(table.queue_ns[ok]),
        prefill=LatencyStats.of(table.prefill_ns[ok]),
        decode=LatencyStats.of(table.decode_ns[ok]),
        inference=LatencyStats.of(table.inference_ns[ok]),
        goodput=good,
        histograms=(
            histogram("ttft", ttft),
            histogram("tpot", tpot),
            histogram("itl", gap),
            histogram("e2e", e2e),
        ),
    )


__all__ = ["HIST_BINS", "good_requests", "histogram", "request_latencies"]
