"""Every metric meshprof sends over OTLP, defined once: name, kind, unit, attributes, buckets.

Names follow OpenTelemetry's conventions: dotted namespaces, the unit in ``unit`` (UCUM:
``s``, ``By``, ``1``, ``{step}``), never in the name, and no ``_total`` (a counter is a
monotonic cumulative sum). Each training instrument carries the Prometheus family of
``/metrics`` (:mod:`meshprof.live.metrics`) it is the OpenTelemetry name of: the same figure,
read from the same live state (a test holds the two sets equal).

The attributes are bounded: ``meshprof.rank`` (the job's ranks), ``meshprof.node`` (the rank's
host), ``meshprof.dim`` (the parallel dimension of a collective's group: ``dp``, ``tp``, ``pp``,
``world``, ``other`` or the layout's own names, never a group's name), ``meshprof.op`` (the
c10d op), ``meshprof.cause`` (the time ledger's causes), an alert's kind and severity.

The GenAI server instruments are the OpenTelemetry GenAI semantic conventions' (names, units,
and the bucket boundaries the conventions ask for): meshprof sends them for serving jobs
(:class:`~meshprof.live.otel.figures.ServingFigures`).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshprof.records.finding import StrEnum
from meshprof.records.live import HIST_BOUNDS_S

RANK = "meshprof.rank"
"""Global rank (int)."""
NODE = "meshprof.node"
"""The rank's host name."""
OP = "meshprof.op"
"""The collective (``all_reduce``, ``send``, ...)."""
DIM = "meshprof.dim"
"""The parallel dimension of the collective's group."""
CAUSE = "meshprof.cause"
"""A time-ledger cause (:class:`~meshprof.records.ledger.TimeCause` value)."""
ALERT_KIND = "meshprof.alert.kind"
"""A live alert rule's kind (``straggler``, ``stall``, ...)."""
ALERT_SEVERITY = "meshprof.alert.severity"
"""``warning`` or ``critical``."""
SIGNAL = "meshprof.otel.signal"
"""``traces`` or ``metrics``."""
DROP_REASON = "meshprof.otel.reason"
"""Why items were dropped: ``queue_full`` (the backend is slower than the job) or
``export_failed`` (it refused them or could not be reached)."""

GENAI_OPERATION = "gen_ai.operation.name"
"""The GenAI operation (``chat``, ``text_completion``, ``generate_content``)."""
GENAI_PROVIDER = "gen_ai.provider.name"
"""The GenAI provider (the serving framework)."""
GENAI_MODEL = "gen_ai.request.model"
"""The model the request asked for."""
ERROR_TYPE = "error.type"
"""Why a request failed (absent when it did not)."""


class Kind(StrEnum):
    """An OpenTelemetry instrument's data type as sent."""

    GAUGE = "gauge"
    """The value now."""
    COUNTER = "counter"
    """A monotonic cumulative sum since the rank (or the exporter) started."""
    HISTOGRAM = "histogram"
    """A cumulative explicit-bucket histogram."""


@dataclass(frozen=True, slots=True)
class Instrument:
    """One metric as sent over OTLP."""

    name: str
    """The OpenTelemetry name (dots, no unit, no ``_total``)."""
    kind: Kind
    """Gauge, counter or histogram."""
    unit: str
    """UCUM unit: ``s``, ``By``, ``1`` (a ratio or a state), ``{step}`` ..."""
    description: str
    """What the value is."""
    attributes: tuple[str, ...]
    """Its attribute keys, every one bounded (see the module docstring)."""
    prometheus: str = ""
    """The ``/metrics`` family it is the OpenTelemetry name of, as ``prometheus_client`` names
    the family (a counter without ``_total``); "" when it has none."""
    buckets: tuple[float, ...] = ()
    """Histogram bucket upper bounds, in ``unit`` (+Inf implied)."""


_R = (RANK, NODE)

RANK_UP = Instrument(
    "meshprof.rank.up",
    Kind.GAUGE,
    "1",
    "1 while the rank publishes fresh records",
    _R,
    "meshprof_rank_up",
)
STEP_DURATION = Instrument(
    "meshprof.step.duration",
    Kind.GAUGE,
    "s",
    "median duration of the recent steps",
    _R,
    "meshprof_step_seconds",
)
STEPS = Instrument(
    "meshprof.steps", Kind.COUNTER, "{step}", "steps completed", _R, "meshprof_steps"
)
STEP_RATE = Instrument(
    "meshprof.step.rate",
    Kind.GAUGE,
    "{step}/s",
    "steps per second over the recent steps",
    _R,
    "meshprof_steps_per_second",
)
TOKEN_RATE = Instrument(
    "meshprof.token.rate",
    Kind.GAUGE,
    "{token}/s",
    "tokens per second over the recent steps",
    _R,
    "meshprof_tokens_per_second",
)
COLLECTIVES = Instrument(
    "meshprof.collectives",
    Kind.COUNTER,
    "{collective}",
    "collectives completed",
    (*_R, OP, DIM),
    "meshprof_collectives",
)
COLLECTIVE_DURATION = Instrument(
    "meshprof.collective.duration",
    Kind.HISTOGRAM,
    "s",
    "collective duration, issue to completion",
    (*_R, OP, DIM),
    "meshprof_collective_seconds",
    HIST_BOUNDS_S,
)
COMM_RATIO = Instrument(
    "meshprof.comm.ratio",
    Kind.GAUGE,
    "1",
    "communication time / step time over the recent steps",
    (*_R, DIM),
    "meshprof_comm_ratio",
)
COMM_EXPOSED_RATIO = Instrument(
    "meshprof.comm.exposed.ratio",
    Kind.GAUGE,
    "1",
    "exposed (not overlapped) communication / step time over the recent steps",
    (*_R, DIM),
    "meshprof_comm_exposed_ratio",
)
MEMORY_USAGE = Instrument(
    "meshprof.memory.usage",
    Kind.GAUGE,
    "By",
    "device memory allocated (CUDA) or process RSS (CPU) at the last step end",
    _R,
    "meshprof_memory_bytes",
)
MEMORY_PEAK = Instrument(
    "meshprof.memory.peak", Kind.GAUGE, "By", "peak memory", _R, "meshprof_memory_peak_bytes"
)
MEMORY_LIMIT = Instrument(
    "meshprof.memory.limit",
    Kind.GAUGE,
    "By",
    "memory in total",
    _R,
    "meshprof_memory_capacity_bytes",
)
INFLIGHT_AGE = Instrument(
    "meshprof.collective.inflight.age",
    Kind.GAUGE,
    "s",
    "age of the oldest collective in flight (0: none)",
    _R,
    "meshprof_inflight_seconds",
)
COMPUTE_DURATION = Instrument(
    "meshprof.compute.duration",
    Kind.GAUGE,
    "s",
    "median over the recent steps of step time minus exposed communication",
    _R,
    "meshprof_compute_seconds",
)
STORAGE_WRITING = Instrument(
    "meshprof.storage.writing",
    Kind.GAUGE,
    "1",
    "1 while the rank writes its files, 0 once writing stopped (full or failing disk)",
    _R,
    "meshprof_storage_writing",
)
STRAGGLER_SCORE = Instrument(
    "meshprof.straggler.score",
    Kind.GAUGE,
    "1",
    "recent compute / the median of the other fresh ranks' of its pipeline stage",
    _R,
    "meshprof_straggler_score",
)
WAIT_DURATION = Instrument(
    "meshprof.straggler.wait",
    Kind.GAUGE,
    "s",
    "per step, the wait for the slowest rank of its stage (recent medians, estimate)",
    _R,
    "meshprof_wait_seconds",
)
BADPUT = Instrument(
    "meshprof.badput.time",
    Kind.COUNTER,
    "s",
    "wall time lost since the rank started recording, by cause (the report's ledger)",
    (*_R, CAUSE),
    "meshprof_badput_seconds",
)
GOODPUT = Instrument(
    "meshprof.goodput.time",
    Kind.COUNTER,
    "s",
    "wall time in productive compute since the rank started recording",
    _R,
    "meshprof_goodput_seconds",
)
WALL = Instrument(
    "meshprof.wall.time",
    Kind.COUNTER,
    "s",
    "wall time the ledger covers: goodput + every badput cause",
    _R,
    "meshprof_wall_seconds",
)
ALERTS = Instrument(
    "meshprof.alerts",
    Kind.COUNTER,
    "{alert}",
    "live alerts raised since the exporter started, by rule and severity",
    (ALERT_KIND, ALERT_SEVERITY),
)

TRAINING: tuple[Instrument, ...] = (
    RANK_UP,
    STEP_DURATION,
    STEPS,
    STEP_RATE,
    TOKEN_RATE,
    COLLECTIVES,
    COLLECTIVE_DURATION,
    COMM_RATIO,
    COMM_EXPOSED_RATIO,
    MEMORY_USAGE,
    MEMORY_PEAK,
    MEMORY_LIMIT,
    INFLIGHT_AGE,
    COMPUTE_DURATION,
    STORAGE_WRITING,
    STRAGGLER_SCORE,
    WAIT_DURATION,
    BADPUT,
    GOODPUT,
    WALL,
    ALERTS,
)
"""The job's figures: ``/metrics``'s set under OpenTelemetry names, and the alerts."""

EXPORTED = Instrument(
    "meshprof.otel.exported",
    Kind.COUNTER,
    "{item}",
    "spans and metric points the exporter sent since it started",
    (SIGNAL,),
)
DROPPED = Instrument(
    "meshprof.otel.dropped",
    Kind.COUNTER,
    "{item}",
    "spans and metric exports the exporter dropped since it started (a slow, refusing or "
    "unreachable backend)",
    (SIGNAL, DROP_REASON),
)

EXPORTER: tuple[Instrument, ...] = (EXPORTED, DROPPED)
"""The exporter's own counters (what it sent and what it dropped)."""

_GENAI = (GENAI_OPERATION, GENAI_PROVIDER, GENAI_MODEL, RANK)

TIME_TO_FIRST_TOKEN = Instrument(
    "gen_ai.server.time_to_first_token",
    Kind.HISTOGRAM,
    "s",
    "Time to generate first token for successful responses.",
    _GENAI,
    "",
    (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
)
TIME_PER_OUTPUT_TOKEN = Instrument(
    "gen_ai.server.time_per_output_token",
    Kind.HISTOGRAM,
    "s",
    "Time per output token generated after the first token for successful responses.",
    _GENAI,
    "",
    (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
)
REQUEST_DURATION = Instrument(
    "gen_ai.server.request.duration",
    Kind.HISTOGRAM,
    "s",
    "Generative AI server request duration such as time-to-last byte or last output token.",
    (*_GENAI, ERROR_TYPE),
    "",
    (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92),
)

GENAI_SERVER: tuple[Instrument, ...] = (
    TIME_TO_FIRST_TOKEN,
    TIME_PER_OUTPUT_TOKEN,
    REQUEST_DURATION,
)
"""The OpenTelemetry GenAI conventions' model-server metrics (serving jobs)."""

ALL: tuple[Instrument, ...] = (*TRAINING, *EXPORTER, *GENAI_SERVER)
"""Every instrument meshprof sends."""


__all__ = [
    "ALL",
    "EXPORTER",
    "GENAI_SERVER",
    "TRAINING",
    "Instrument",
    "Kind",
]
