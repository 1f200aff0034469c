"""Serving: the service levels a user asks for, and the live figures of a serving rank.

:class:`ServiceLevels` is what ``--slo ttft=200ms,tpot=50ms,e2e=2s`` says (``meshprof report``
and ``meshprof run``). :class:`ServingLive` is the one typed snapshot of a serving rank's live
figures, published in its live record every second (``RankLive.serving``): counters and
histograms that stay bounded however long the server runs, and percentiles over the recent
window. The live views, the Prometheus exporter and any other exporter read it as it is. The
intervals are those of the report (docs/definitions.md, Serving); times are seconds here (the
exporters' unit), wall clock ns where a name ends in ``_ns``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from meshprof.errors import MeshprofError

SLO_NAMES = ("ttft", "tpot", "itl", "e2e")
"""The figures an SLO can bound (as ``vllm bench serve --goodput``: ttft, tpot, e2el; itl
bounds every gap of a request)."""

_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_ONE = re.compile(r"\s*(\w+)\s*[=:]\s*([0-9]*\.?[0-9]+(?:e-?\d+)?)\s*(ns|us|µs|ms|s)?\s*")


@dataclass(frozen=True, slots=True)
class ServiceLevels:
    """Upper bounds a request must meet to count as good (seconds; None: not bounded)."""

    ttft_s: float | None = None
    """Time to first token."""
    tpot_s: float | None = None
    """Time per output token, (E2E − TTFT) / (output tokens − 1); a request of one output
    token meets it (as ``vllm bench serve``, which counts its TPOT as 0)."""
    itl_s: float | None = None
    """Every inter-token gap of the request."""
    e2e_s: float | None = None
    """End-to-end latency, arrival to finish."""

    def __post_init__(self) -> None:
        for name in SLO_NAMES:
            v = getattr(self, f"{name}_s")
            if v is not None and not (math.isfinite(v) and v > 0):
                raise MeshprofError(f"SLO {name}={v!r}: expected a time above 0")

    @property
    def empty(self) -> bool:
        """No figure is bounded."""
        return all(getattr(self, f"{n}_s") is None for n in SLO_NAMES)

    def text(self) -> str:
        """``ttft=200ms,tpot=50ms`` as a user writes it."""
        parts = []
        for n in SLO_NAMES:
            v = getattr(self, f"{n}_s")
            if v is not None:
                parts.append(f"{n}={v * 1e3:g}ms")
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str) -> ServiceLevels:
        """``ttft=200ms,tpot=50ms,e2e=2s`` (units ns, us, ms, s; a bare number is
        milliseconds, as ``vllm bench serve --goodput``); MeshprofError names what is wrong."""
        got: dict[str, float] = {}
        for part in text.split(","):
            if not part.strip():
                continue
            m = _ONE.fullmatch(part)
            name = m.group(1).lower() if m else ""
            name = "e2e" if name == "e2el" else name
            if m is None or name not in SLO_NAMES:
                raise MeshprofError(
                    f"--slo {text!r}: expected NAME=TIME[,...] with NAME one of "
                    f"{', '.join(SLO_NAMES)} (e.g. ttft=200ms,tpot=50ms)"
                )
            got[f"{name}_s"] = float(m.group(2)) * _UNITS_S[m.group(3) or "ms"]
        if not got:
            raise MeshprofError(f"--slo {text!r}: no service level given")
        return cls(**got)


TTFT_BOUNDS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""Bucket bounds of the time-to-first-token histogram (s): vLLM's, which hold OpenTelemetry
GenAI's for ``gen_ai.server.time_to_first_token``."""
ITL_BOUNDS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""Bucket bounds of the inter-token latency and time-per-output-token histograms (s): vLLM's
(which hold OpenTelemetry GenAI's for ``gen_ai.server.time_per_output_token``) with four below
10 ms, where a small model's decode step lies."""
REQUEST_BOUNDS_S: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.3, 0.32, 0.5, 0.64, 0.8, 1.0, 1.28, 1.5, 2.0, 2.5, 2.56,
    5.0, 5.12, 10.0, 10.24, 15.0, 20.0, 20.48, 30.0, 40.0, 40.96, 50.0, 60.0, 81.92, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""Bucket bounds of the request-duration histograms (e2e, queue, prefill, decode, inference;
s): vLLM's and OpenTelemetry GenAI's ``gen_ai.server.request.duration`` bounds, merged."""
TOKENS_BOUNDS: tuple[float, ...] = tuple(float(1 << k) for k in range(0, 18))
"""Bucket bounds of the prompt- and output-token histograms: 1, 2, 4, ... 131,072 tokens."""

HISTOGRAMS: dict[str, tuple[tuple[float, ...], str]] = {
    "ttft": (TTFT_BOUNDS_S, "time_to_first_token_seconds"),
    "itl": (ITL_BOUNDS_S, "inter_token_latency_seconds"),
    "tpot": (ITL_BOUNDS_S, "request_time_per_output_token_seconds"),
    "e2e": (REQUEST_BOUNDS_S, "e2e_request_latency_seconds"),
    "queue": (REQUEST_BOUNDS_S, "request_queue_time_seconds"),
    "prefill": (REQUEST_BOUNDS_S, "request_prefill_time_seconds"),
    "decode": (REQUEST_BOUNDS_S, "request_decode_time_seconds"),
    "inference": (REQUEST_BOUNDS_S, "request_inference_time_seconds"),
    "prompt_tokens": (TOKENS_BOUNDS, "request_prompt_tokens"),
    "output_tokens": (TOKENS_BOUNDS, "request_generation_tokens"),
}
"""Each live histogram: its bucket bounds and its name after ``meshprof_`` (vLLM's name after
``vllm:``, one to one)."""


@dataclass(slots=True)
class Histogram:
    """A cumulative histogram since the rank started serving (bounded: one count per bucket)."""

    name: str
    """Its key in :data:`HISTOGRAMS` (``ttft``, ``itl``, ...)."""
    bounds: list[float]
    """Upper bounds of the buckets (seconds, or tokens); +Inf is implied after the last."""
    buckets: list[int]
    """Non-cumulative counts per bucket (one more than ``bounds``: the last is > the last
    bound)."""
    count: int = 0
    """Observations."""
    total: float = 0.0
    """Sum of the observations (seconds, or tokens)."""

    @classmethod
    def empty(cls, name: str) -> Histogram:
        bounds = HISTOGRAMS[name][0]
        return cls(name, list(bounds), [0] * (len(bounds) + 1))


@dataclass(slots=True)
class WindowFigures:
    """Figures over the recent window (the requests finished, the gaps seen in it)."""

    window_s: float = 0.0
    """Seconds the window covers (from its oldest observation to the record)."""
    requests: int = 0
    """Requests finished in the window (every reason)."""
    ttft_p50_s: float = math.nan
    """Time to first token, median of the window's successful requests (s; NaN: none)."""
    ttft_p99_s: float = math.nan
    """Its 99th percentile (s)."""
    itl_p50_s: float = math.nan
    """Inter-token latency, median of every gap in the window (s)."""
    itl_p99_s: float = math.nan
    """Its 99th percentile (s)."""
    tpot_p50_s: float = math.nan
    """Time per output token, median of the window's successful requests (s)."""
    tpot_p99_s: float = math.nan
    """Its 99th percentile (s)."""
    e2e_p50_s: float = math.nan
    """End-to-end latency, median of the window's successful requests (s)."""
    e2e_p99_s: float = math.nan
    """Its 99th percentile (s)."""
    requests_per_s: float = 0.0
    """Requests finished per second."""
    output_tokens_per_s: float = 0.0
    """Output tokens emitted per second."""
    error_rate: float = 0.0
    """Requests finished with ``error`` / requests finished (0 when none finished)."""
    goodput_per_s: float = math.nan
    """Requests per second that met every service level (NaN without service levels)."""
    slo_attainment: float = math.nan
    """Requests that met every service level / successful requests finished (NaN without
    service levels or requests)."""


@dataclass(slots=True)
class ServingLive:
    """A serving rank's live figures (``RankLive.serving``; see the module docstring)."""

    serves_requests: bool = True
    """This rank records requests (the serving rank, or every rank of a tensor-parallel
    ``generate()``); False: a rank that only runs the forwards, with its decode figures."""
    requests_running: int = 0
    """Requests scheduled and not finished (``vllm:num_requests_running``)."""
    requests_waiting: int = 0
    """Requests begun and not scheduled yet (``vllm:num_requests_waiting``)."""
    requests_finished: dict[str, int] = field(default_factory=dict)
    """Requests finished since the rank started, by reason (stop, length, abort, error)."""
    prompt_tokens: int = 0
    """Prompt tokens of the requests begun since the rank started."""
    output_tokens: int = 0
    """Output tokens emitted since the rank started."""
    histograms: list[Histogram] = field(default_factory=list)
    """The cumulative histograms of :data:`HISTOGRAMS` (successful requests; every gap)."""
    window: WindowFigures = field(default_factory=WindowFigures)
    """Percentiles and rates over the recent window."""
    slo: ServiceLevels | None = None
    """The service levels goodput is counted against (``meshprof run --slo``)."""
    good_requests: int = 0
    """Successful requests since the rank started that met every service level."""
    decode_steps: int = 0
    """Decode steps (steps named "decode") seen in the recent window, on this rank."""
    decode_step_s: float = math.nan
    """Median duration of those decode steps (s)."""
    decode_compute_s: float = math.nan
    """Median over them of step time − this rank's collective time (s): what a straggling rank
    in decode shows more of than its peers."""

    def histogram(self, name: str) -> Histogram | None:
        """The histogram ``name`` (a key of :data:`HISTOGRAMS`), None when absent."""
        for h in self.histograms:
            if h.name == name:
                return h
        return None


__all__ = [
    "HISTOGRAMS",
    "ITL_BOUNDS_S",
    "REQUEST_BOUNDS_S",
    "SLO_NAMES",
    "TOKENS_BOUNDS",
    "TTFT_BOUNDS_S",
    "Histogram",
    "ServiceLevels",
    "ServingLive",
    "WindowFigures",
]
