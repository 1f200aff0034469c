"""A serving rank's live histograms under the OpenTelemetry GenAI conventions' bucket bounds.

A serving rank publishes cumulative histograms of its requests
(:class:`~meshprof.records.serving.ServingLive`, vLLM's bucket bounds); the GenAI conventions
ask for their own bounds (:data:`~meshprof.live.otel.instruments.GENAI_SERVER`). Each GenAI
bound is also one of the rank's (a test holds them so:
:data:`~meshprof.records.serving.TTFT_BOUNDS_S` ⊇ ``gen_ai.server.time_to_first_token``'s,
:data:`~meshprof.records.serving.ITL_BOUNDS_S` ⊇ ``gen_ai.server.time_per_output_token``'s,
:data:`~meshprof.records.serving.REQUEST_BOUNDS_S` ⊇ ``gen_ai.server.request.duration``'s), so
re-bucketing adds up whole buckets and is exact: each GenAI bucket's count is the number of
requests whose value lies in it, as if they had been counted under the GenAI bounds in the first
place. The count and the sum carry over unchanged.

What the live record holds decides what is sent: its histograms count the *successful* requests
(finished ``stop`` or ``length``), so ``gen_ai.server.request.duration`` is sent without
``error.type`` (the failed requests' durations are on their spans, with ``error.type``).
``gen_ai.server.request.duration`` is the request's arrival to its finish (its last token).
"""

from __future__ import annotations

from collections.abc import Sequence

from meshprof.live.otel import instruments as I

OPERATION = "text_completion"
"""``gen_ai.operation.name`` of meshprof's request API (prompt in, tokens out)."""
PROVIDER = "meshprof"
"""``gen_ai.provider.name``: the serving loop instrumented with meshprof's request API."""

SOURCES = {
    I.TIME_TO_FIRST_TOKEN.name: "ttft",
    I.TIME_PER_OUTPUT_TOKEN.name: "tpot",
    I.REQUEST_DURATION.name: "e2e",
}
"""Each GenAI instrument and the live histogram it is made of
(:data:`~meshprof.records.serving.HISTOGRAMS`)."""


def holds(src: Sequence[float], dst: Sequence[float]) -> bool:
    """Every bound of ``dst`` is a bound of ``src``: re-bucketing from ``src`` is exact."""
    have = set(src)
    return all(b in have for b in dst)


def rebucket(src: Sequence[float], counts: Sequence[int], dst: Sequence[float]) -> tuple[int, ...]:
    """Per-bucket ``counts`` under bounds ``src`` (``len(src) + 1`` of them, +Inf last) as
    counts under bounds ``dst``: each source bucket goes to the first ``dst`` bucket whose bound
    is at or above its own (+Inf: the last). Exact when :func:`holds` (``src``, ``dst``); else a
    source bucket straddling a ``dst`` bound is counted above it."""
    out = [0] * (len(dst) + 1)
    j = 0
    for i, c in enumerate(counts):
        if i >= len(src):
            out[-1] += int(c)
            continue
        while j < len(dst) and dst[j] < src[i]:
            j += 1
        out[j] += int(c)
    return tuple(out)


__all__ = [
    "OPERATION",
    "PROVIDER",
    "SOURCES",
    "holds",
    "rebucket",
]
