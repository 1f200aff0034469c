"""The serving metric families of the Prometheus exporter (:mod:`meshprof.live.metrics`), from
each serving rank's live figures (:class:`~meshprof.records.serving.ServingLive`).

Names are vLLM's after ``meshprof_`` instead of ``vllm:``, one to one (labels ``rank``,
``node``): the histograms ``meshprof_time_to_first_token_seconds``,
``meshprof_inter_token_latency_seconds``, ``meshprof_request_time_per_output_token_seconds``,
``meshprof_e2e_request_latency_seconds``, ``meshprof_request_queue_time_seconds``,
``meshprof_request_prefill_time_seconds``, ``meshprof_request_decode_time_seconds``,
``meshprof_request_inference_time_seconds``, ``meshprof_request_prompt_tokens``,
``meshprof_request_generation_tokens`` (buckets: :data:`~meshprof.records.serving.HISTOGRAMS`,
holding OpenTelemetry GenAI's); the counters ``meshprof_request_success_total{finished_reason}``,
``meshprof_prompt_tokens_total``, ``meshprof_generation_tokens_total``; the gauges
``meshprof_num_requests_running`` and ``meshprof_num_requests_waiting``. meshprof's own:
``meshprof_request_good_total`` (successful requests that met every service level of
``--slo``), the recent window's ``meshprof_request_goodput_per_second``,
``meshprof_slo_attainment_ratio``, ``meshprof_request_error_ratio``,
``meshprof_output_tokens_per_second``, and on every rank with decode steps
``meshprof_decode_compute_seconds`` and ``meshprof_decode_straggler_score`` (its decode compute
over its peers' median). Every counter and histogram is cumulative and bounded (one number per
bucket, whatever the run's length).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from meshprof.analyze.live.serving_rules import decode_excess
from meshprof.records.live import RankLive
from meshprof.records.serving import HISTOGRAMS, Histogram

PREFIX = "meshprof_"


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    out, acc = [], 0
    for bound, c in zip((*h.bounds, math.inf), h.buckets, strict=False):
        acc += int(c)
        out.append(("+Inf" if bound == math.inf else repr(float(bound)), float(acc)))
    return out


def serving_families(recs: dict[int, RankLive], stale: set[int]) -> Iterator[Any]:
    """The serving families over the ranks' records (empty families when none serves)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    rl = ["rank", "node"]
    hist = {
        name: HistogramMetricFamily(PREFIX + metric, f"vllm:{metric}", labels=rl)
        for name, (_, metric) in HISTOGRAMS.items()
    }
    success = CounterMetricFamily(
        PREFIX + "request_success", "requests finished, by reason", labels=[*rl, "finished_reason"]
    )
    good = CounterMetricFamily(
        PREFIX + "request_good", "successful requests that met every service level", labels=rl
    )
    prompt = CounterMetricFamily(PREFIX + "prompt_tokens", "prompt tokens", labels=rl)
    gen = CounterMetricFamily(PREFIX + "generation_tokens", "output tokens", labels=rl)
    running = GaugeMetricFamily(PREFIX + "num_requests_running", "requests running", labels=rl)
    waiting = GaugeMetricFamily(PREFIX + "num_requests_waiting", "requests waiting", labels=rl)
    goodput = GaugeMetricFamily(
        PREFIX + "request_goodput_per_second",
        "requests per second that met every service level, recent window",
        labels=rl,
    )
    attain = GaugeMetricFamily(
        PREFIX + "slo_attainment_ratio",
        "requests that met every service level / successful requests, recent window",
        labels=rl,
    )
    errors = GaugeMetricFamily(
        PREFIX + "request_error_ratio", "requests finished with an error, recent window", labels=rl
    )
    tps = GaugeMetricFamily(
        PREFIX + "output_tokens_per_second", "output tokens per second, recent window", labels=rl
    )
    dcomp = GaugeMetricFamily(
        PREFIX + "decode_compute_seconds",
        "median over the recent decode steps of step time minus collective time",
        labels=rl,
    )
    dscore = GaugeMetricFamily(
        PREFIX + "decode_straggler_score",
        "recent decode compute / the median of the other fresh ranks' of its stage",
        labels=rl,
    )
    excess = decode_excess(recs, stale)
    for r, x in recs.items():
        s = x.serving
        if s is None:
            continue
        lab = [str(r), x.hostname or x.node_id]
        if s.decode_steps and math.isfinite(s.decode_compute_s):
            dcomp.add_metric(lab, s.decode_compute_s)
        if r in excess:
            dscore.add_metric(lab, 1.0 + excess[r][0])
        if not s.serves_requests:
            continue
        for h in s.histograms:
            if h.name in hist:
                hist[h.name].add_metric(lab, _buckets(h), sum_value=h.total)
        for reason, n in s.requests_finished.items():
            success.add_metric([*lab, reason], float(n))
        good.add_metric(lab, float(s.good_requests))
        prompt.add_metric(lab, float(s.prompt_tokens))
        gen.add_metric(lab, float(s.output_tokens))
        running.add_metric(lab, float(s.requests_running))
        waiting.add_metric(lab, float(s.requests_waiting))
        w = s.window
        if math.isfinite(w.goodput_per_s):
            goodput.add_metric(lab, w.goodput_per_s)
        if math.isfinite(w.slo_attainment):
            attain.add_metric(lab, w.slo_attainment)
        errors.add_metric(lab, w.error_rate)
        tps.add_metric(lab, w.output_tokens_per_s)
    yield from hist.values()
    yield from (success, good, prompt, gen, running, waiting, goodput, attain, errors, tps)
    yield from (dcomp, dscore)


__all__ = ["PREFIX", "serving_families"]
