"""The serving analysis' typed results (times in ns unless a name says otherwise)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from meshprof.records.finding import Finding
from meshprof.records.serving import ServiceLevels

PERCENTILES = (50, 90, 95, 99)
"""The percentiles every latency figure is given at (with the mean and the maximum)."""


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """One figure over the requests (or gaps): count, mean, percentiles (linear
    interpolation, as numpy and ``vllm bench serve``) and the extremes."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    min: float

    @classmethod
    def of(cls, values: np.ndarray) -> LatencyStats:
        """Of the finite ``values`` (NaN when none is)."""
        a = np.asarray(values, dtype=np.float64)
        a = a[np.isfinite(a)]
        if not len(a):
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan, nan)
        p50, p90, p95, p99 = (float(x) for x in np.percentile(a, PERCENTILES))
        return cls(len(a), float(a.mean()), p50, p90, p95, p99, float(a.max()), float(a.min()))

    def at(self, pct: int) -> float:
        """The ``pct``-th percentile (50, 90, 95 or 99)."""
        return float(getattr(self, f"p{pct}"))


@dataclass(frozen=True, slots=True)
class Histogram:
    """A figure's distribution for drawing: counts between log-spaced edges (ns or tokens)."""

    name: str
    """``ttft``, ``itl``, ``tpot``, ``e2e``."""
    edges: tuple[float, ...]
    """Bin edges, ascending (one more than ``counts``)."""
    counts: tuple[int, ...]
    """Values in each bin [edge_i, edge_i+1) (the last bin includes its upper edge)."""


@dataclass(frozen=True, slots=True)
class Goodput:
    """Requests that met every service level the user gave (``vllm bench serve --goodput``)."""

    slo: ServiceLevels
    """The service levels."""
    good: int
    """Successful requests that met every bounded figure."""
    judged: int
    """Successful requests (those judged)."""
    per_s: float
    """good / the serving duration (requests per second)."""
    attainment: float
    """good / judged (NaN when none was judged)."""
    missed: dict[str, int] = field(default_factory=dict)
    """Per bounded figure (ttft, tpot, itl, e2e): successful requests over its bound."""


@dataclass(frozen=True, slots=True)
class RequestLatencies:
    """The request figures of a serving run, with ``vllm bench serve``'s definitions."""

    rank: int
    """The serving rank read (the lowest that recorded requests)."""
    ranks_with_requests: tuple[int, ...]
    """Every rank that recorded requests."""
    requests: int
    """Requests recorded (every reason, those unfinished at the end included)."""
    successful: int
    """Requests finished with ``stop`` or ``length``: the latency figures are over these."""
    unfinished: int
    """Requests still running at the rank's last write."""
    reasons: dict[str, int]
    """Finished requests by reason (stop, length, abort, error)."""
    error_rate: float
    """Requests finished with ``error`` / requests finished (0 when none finished)."""
    duration_ns: float
    """First arrival to last finish (the benchmark duration of ``vllm bench serve``)."""
    request_rate: float
    """Successful requests / duration (per second)."""
    output_tokens_per_s: float
    """Output tokens of the successful requests / duration."""
    total_tokens_per_s: float
    """Prompt and output tokens of the successful requests / duration."""
    prompt_tokens: LatencyStats
    """Prompt tokens per successful request (tokens)."""
    output_tokens: LatencyStats
    """Output tokens per successful request (tokens)."""
    ttft: LatencyStats
    """Time to first token (ns)."""
    tpot: LatencyStats
    """Time per output token per request, (E2E − TTFT) / (output tokens − 1) (ns)."""
    itl: LatencyStats
    """Every inter-token gap of the successful requests (ns)."""
    e2e: LatencyStats
    """Arrival to finish (ns)."""
    queue: LatencyStats
    """Queued to scheduled (ns)."""
    prefill: LatencyStats
    """Scheduled to first token (ns)."""
    decode: LatencyStats
    """First token to last token (ns)."""
    inference: LatencyStats
    """Scheduled to last token (ns)."""
    goodput: Goodput | None
    """Against the service levels given (``--slo``); None without."""
    histograms: tuple[Histogram, ...] = ()
    """TTFT, TPOT, ITL and E2E distributions for drawing."""


@dataclass(frozen=True, slots=True)
class KindSummary:
    """The serving steps of one kind on the serving rank."""

    kind: str
    """``prefill``, ``decode`` or ``mixed``."""
    steps: int
    """Steps of this kind."""
    step: LatencyStats
    """Their durations (ns)."""
    prompt_tokens: int
    """Prompt tokens they computed (the prompts of the requests whose first token they
    emitted)."""
    output_tokens: int
    """Output tokens they emitted."""
    batch: LatencyStats
    """Requests that got a token per step."""


@dataclass(frozen=True, slots=True)
class DimShare:
    """One parallelism dimension's collectives in the steps of one kind, on one rank or all."""

    dim: str
    """``tp``, ``pp``, ``dp``, ``world``, ..."""
    comm_ns: float
    """Mean per step of the collectives' time (issue to completion, summed)."""
    transfer_ns: float
    """The part after the last member arrived (the data moving): comm − wait."""
    wait_ns: float
    """The part spent waiting for the last member to arrive."""
    share: float
    """comm_ns / the mean step (fraction)."""
    wait_share: float
    """wait_ns / the mean step (fraction)."""


@dataclass(frozen=True, slots=True)
class RankStepBreakdown:
    """One rank's time in the steps of one kind (means per step, ns)."""

    rank: int
    kind: str
    steps: int
    """Steps of this kind the rank recorded."""
    step_ns: float
    """Mean step duration on this rank."""
    compute_ns: float
    """Mean step − its collective time: compute, and everything that is not a collective."""
    transfer_ns: float
    """Mean collective time after the last member arrived."""
    wait_ns: float
    """Mean collective time spent waiting for the last member."""
    last_arrivals: int
    """Collectives of these steps this rank arrived last at (among those with ≥ 2 members)."""
    caused_wait_ns: float
    """Mean per step of the other members' wait at the collectives it arrived last at."""
    excess_ns: float
    """Median per step of its compute over its peers' median (the other ranks of its pipeline
    stage): what it computes more than they do."""
    dims: tuple[DimShare, ...] = ()
    """Its collectives by dimension."""


@dataclass(frozen=True, slots=True)
class RankCostToRequests:
    """What one rank's extra compute costs the requests: the what-if for serving."""

    rank: int
    """Global rank."""
    decode_step_saving_ns: float
    """Median over the decode steps of how much shorter the step would be if this rank
    computed like its peers (a replay of the step's collectives)."""
    prefill_step_saving_ns: float
    """The same over the prefill steps (NaN without prefill steps)."""
    excess_ns: float
    """Median over the decode steps of its compute over its peers' median."""
    since_step: int
    """The first step of its excess (the onset): where the excess steps up and stays; -1 when
    it has none."""
    since_ns: int
    """When that step began (wall clock of the rank, ns; 0 when unknown)."""
    requests: int
    """Requests whose steps were all replayed (the predictions are over these)."""
    ttft_p50_ns: float
    """Their TTFT p50 as recorded."""
    ttft_p50_after_ns: float
    """Their TTFT p50 with the rank as fast as its peers (each request's TTFT less the
    savings of the steps that ended between its arrival and its first token)."""
    ttft_p99_ns: float
    ttft_p99_after_ns: float
    tpot_p50_ns: float
    """Their TPOT p50 as recorded."""
    tpot_p50_after_ns: float
    """Their TPOT p50 with the rank as fast as its peers (each request's E2E − TTFT less the
    savings of its decode steps, over its output tokens − 1)."""
    tpot_p99_ns: float
    tpot_p99_after_ns: float

    @property
    def tpot_saving_ns(self) -> float:
        """TPOT p50 saved."""
        return self.tpot_p50_ns - self.tpot_p50_after_ns

    @property
    def ttft_saving_ns(self) -> float:
        """TTFT p50 saved."""
        return self.ttft_p50_ns - self.ttft_p50_after_ns


@dataclass(frozen=True, slots=True)
class TimelineStep:
    """One step of a slow request's timeline."""

    step: int
    kind: str
    start_ns: int
    """Wall clock of the serving rank."""
    duration_ns: int
    last_rank: int
    """The rank that arrived last at most of the step's collectives (-1: none)."""
    caused_wait_ns: float
    """The other ranks' wait for it in the step."""


@dataclass(frozen=True, slots=True)
class SlowRequest:
    """One of the slowest requests, with its timeline and what made it slow."""

    id: int
    """Request id."""
    why: str
    """Which figure put it among the slowest: ``ttft`` or ``e2e`` (p99 and above)."""
    arrival_ns: int
    ttft_ns: float
    e2e_ns: float
    tpot_ns: float
    queue_ns: float
    prefill_ns: float
    decode_ns: float
    output_tokens: int
    prompt_tokens: int
    cause: str
    """What made it slow, in words: the interval furthest above the median request's
    (queue, prefill or decode) and, for decode, the rank that arrived last most."""
    steps: tuple[TimelineStep, ...] = ()
    """Its prefill step and its slowest decode steps (at most a few)."""
    decode_steps: int = 0
    """Steps between its first and last token."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingFinding(Finding):
    """A conclusion about the serving job (kind ``decode_straggler``, ``slo``,
    ``serving_communication``, ``queueing`` or ``request_errors``)."""

    since_step: int = -1
    """The step its condition began at (-1: the whole run, or unknown)."""
    value: float = math.nan
    """Its figure: the TPOT p50 saved (decode_straggler, ns), the SLO attainment (slo, a
    fraction), the decode steps' wait share (serving_communication), the queue p50 (ns)
    or the error rate."""


@dataclass(frozen=True, slots=True)
class ServingReport:
    """The serving section of the report."""

    latencies: RequestLatencies
    """The request figures."""
    kinds: tuple[KindSummary, ...] = ()
    """The serving steps by kind (serving rank)."""
    ranks: tuple[RankStepBreakdown, ...] = ()
    """Every rank's time per step, by kind."""
    dims: tuple[tuple[str, tuple[DimShare, ...]], ...] = ()
    """Per kind, the collectives by dimension, mean over ranks."""
    costs: tuple[RankCostToRequests, ...] = ()
    """What each rank's extra compute costs the requests, largest TPOT saving first."""
    slow: tuple[SlowRequest, ...] = ()
    """The slowest requests (TTFT or E2E at p99 and above), slowest first."""
    findings: tuple[ServingFinding, ...] = ()
    """The conclusions, most severe first."""
    steps_from: int = -1
    """The first step analysed (the report's window)."""
    steps_to: int = -1
    """The last step analysed."""
    note: str = ""
    """Why part of it could not be computed, if so."""


__all__ = [
    "PERCENTILES",
    "DimShare",
    "Goodput",
    "Histogram",
    "KindSummary",
    "LatencyStats",
    "RankCostToRequests",
    "RankStepBreakdown",
    "RequestLatencies",
    "ServingFinding",
    "ServingReport",
    "SlowRequest",
    "TimelineStep",
]
