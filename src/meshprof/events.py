"""The one event schema: collective ops, their bandwidth factors, and the event records.

Everything that records, stores, loads or analyzes a collective uses the names defined here.
Times are integers in nanoseconds; sizes are bytes; bandwidths are GB/s (1e9 bytes per second).
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np


class OpType(str, enum.Enum):
    """A collective or point-to-point operation, named as torch.distributed names it."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    SCATTER = "scatter"
    GATHER = "gather"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"
    BARRIER = "barrier"
    ALL_GATHER_OBJECT = "all_gather_object"
    GATHER_OBJECT = "gather_object"
    BROADCAST_OBJECT_LIST = "broadcast_object_list"
    SCATTER_OBJECT_LIST = "scatter_object_list"
    SEND_OBJECT_LIST = "send_object_list"
    RECV_OBJECT_LIST = "recv_object_list"
    CUSTOM = "custom"

    def __str__(self) -> str:
        return self.value


#: Op codes stored in the columnar log. Codes >= CUSTOM_BASE index the log's label table.
OP_CODES: dict[str, int] = {op.value: i for i, op in enumerate(OpType)}
OP_NAMES: list[str] = [op.value for op in OpType]
CUSTOM_BASE = 64

P2P_OPS = frozenset({"send", "recv", "send_object_list", "recv_object_list"})
OBJECT_OPS = frozenset(
    {
        "all_gather_object",
        "gather_object",
        "broadcast_object_list",
        "scatter_object_list",
        "send_object_list",
        "recv_object_list",
    }
)

_BUS_FACTOR_N_MINUS_1_OVER_N = frozenset(
    {
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "gather",
        "scatter",
        "all_gather_object",
        "gather_object",
        "scatter_object_list",
    }
)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor for ``op`` over ``n`` ranks.

    all_reduce: 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter: (n-1)/n;
    broadcast, reduce, send, recv (and everything else): 1.
    """
    if n <= 1:
        return 0.0 if op in _BUS_FACTOR_N_MINUS_1_OVER_N or op == "all_reduce" else 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in _BUS_FACTOR_N_MINUS_1_OVER_N:
        return (n - 1) / n
    return 1.0


_GATHER_LIKE = frozenset({"gather", "gather_object"})
_SCATTER_LIKE = frozenset({"scatter", "scatter_object_list"})


def nccl_tests_size(op: str, in_bytes: int, out_bytes: int, n: int) -> int:
    """The buffer size S (bytes) that nccl-tests divides by time to get algbw.

    nccl-tests reports, per op, the size of the *largest* buffer: the full buffer for
    all_reduce/reduce/broadcast, the gathered output for all_gather and gather, the unscattered
    input for reduce_scatter and scatter, the whole send buffer for all_to_all, the message for
    send/recv. With in_bytes/out_bytes being this rank's own input/output sizes that is
    max(in, out), except gather (in * n) and scatter (out * n), whose non-root ranks never hold
    the full buffer.
    """
    if op in _GATHER_LIKE:
        return in_bytes * max(n, 1)
    if op in _SCATTER_LIKE:
        return out_bytes * max(n, 1)
    return max(in_bytes, out_bytes)


def bandwidth_gbps(
    op: str, in_bytes: int, out_bytes: int, duration_ns: int, n: int
) -> tuple[float, float]:
    """(algbw, busbw) in GB/s following nccl-tests; (0, 0) when the duration is unknown or zero."""
    if duration_ns <= 0:
        return 0.0, 0.0
    algbw = nccl_tests_size(op, in_bytes, out_bytes, n) / duration_ns  # bytes/ns == GB/s
    return algbw, algbw * bus_factor(op, n)


def nccl_tests_size_array(
    op_codes: np.ndarray, in_bytes: np.ndarray, out_bytes: np.ndarray, group_size: np.ndarray
) -> np.ndarray:
    """Vectorized :func:`nccl_tests_size` (bytes, int64)."""
    n = np.maximum(group_size.astype(np.int64), 1)
    s = np.maximum(in_bytes, out_bytes).astype(np.int64)
    g = np.isin(op_codes, [OP_CODES[o] for o in _GATHER_LIKE])
    sc = np.isin(op_codes, [OP_CODES[o] for o in _SCATTER_LIKE])
    s = np.where(g, in_bytes.astype(np.int64) * n, s)
    return np.where(sc, out_bytes.astype(np.int64) * n, s)


def bandwidth_arrays(
    op_codes: np.ndarray,
    in_bytes: np.ndarray,
    out_bytes: np.ndarray,
    duration_ns: np.ndarray,
    group_size: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorized :func:`bandwidth_gbps` over columns. Returns (algbw, busbw) GB/s arrays."""
    size_bytes = nccl_tests_size_array(op_codes, in_bytes, out_bytes, group_size)
    dur = duration_ns.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        alg = np.where(dur > 0, size_bytes.astype(np.float64) / np.where(dur > 0, dur, 1.0), 0.0)
    n = group_size.astype(np.float64)
    factor = np.ones_like(alg)
    ar = op_codes == OP_CODES["all_reduce"]
    factor = np.where(ar, np.where(n > 1, 2.0 * (n - 1) / np.maximum(n, 1), 0.0), factor)
    nm1 = np.isin(op_codes, [OP_CODES[o] for o in _BUS_FACTOR_N_MINUS_1_OVER_N])
    factor = np.where(nm1, np.where(n > 1, (n - 1) / np.maximum(n, 1), 0.0), factor)
    return alg, alg * factor


class Status(str, enum.Enum):
    """Outcome of a recorded collective: ``ok``, ``error``, or ``pending`` for a collective
    issued and not completed at the read that returned it (in flight: ``duration_ns`` -1, no
    bandwidth, ``start_ns`` its issue time; a later read returns it completed, once)."""

    OK = "ok"
    ERROR = "error"
    PENDING = "pending"

    def __str__(self) -> str:
        return self.value


STATUS_CODES = {"ok": 0, "error": 1, "pending": 2}
STATUS_NAMES = ["ok", "error", "pending"]

#: Columnar layout of one retained event (packed, 54 bytes). Strings live in side tables.
EVENT_DTYPE = np.dtype(
    [
        ("op", np.uint8),  # OP_CODES / CUSTOM_BASE + label index
        ("status", np.uint8),  # STATUS_CODES
        ("dtype", np.uint8),  # index into the log's dtype table
        ("flags", np.uint8),  # FLAG_* bits
        ("group", np.uint16),  # index into the log's group table
        ("peer", np.int32),  # global rank of the peer for send/recv, -1 otherwise
        ("seq", np.int64),  # sequence number within the group (per peer pair for p2p)
        ("in_bytes", np.int64),
        ("out_bytes", np.int64),
        ("start_ns", np.int64),  # wall clock (time.time_ns) at issue
        ("duration_ns", np.int64),  # issue -> completion; -1 while pending (in flight)
        ("step", np.int32),  # training step at issue, -1 when unknown
    ]
)
FLAG_ASYNC = 1
FLAG_DEVICE_TIMING = 2
FLAG_DROPPED = 4  # timed and counted, but shorter than min_duration: not retained in the ring
FLAG_UNSAMPLED = 8  # with FLAG_DROPPED: left out by sampling, counted only (duration -1)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A process group as the recorder saw it."""

    name: str
    """The group's name (``ProcessGroup.group_name``), unique in the job."""
    desc: str
    """Human description (``group_desc``), e.g. "default_pg" or "mesh_tp"."""
    ranks: tuple[int, ...]
    """Global ranks of the members, in group-rank order."""
    backend: str = ""
    """Backend name, e.g. "gloo" or "nccl"."""

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True, slots=True)
class CommEvent:
    """One collective or point-to-point op on one rank (the JSON export's event object)."""

    op: str
    rank: int
    world_size: int
    group_name: str
    group_desc: str
    group_ranks: tuple[int, ...]
    seq: int
    dtype: str
    in_bytes: int
    out_bytes: int
    start_ns: int
    duration_ns: int
    algbw_gbps: float
    busbw_gbps: float
    status: str = "ok"
    error: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    peer: int = -1
    step: int = -1
    async_op: bool = False

    @property
    def in_flight(self) -> bool:
        """Issued and not completed when it was read (status ``pending``, ``duration_ns`` -1)."""
        return self.status == Status.PENDING.value

    def to_dict(self) -> dict[str, Any]:
        """The fields by name (what ``dataclasses.asdict`` gives, ``group_ranks`` a list), built
        directly: ``asdict`` recurses into and deep-copies every value (21 µs an event here,
        1.4 µs this way; ``export_json`` calls it per event). ``metadata`` is still a deep
        copy, so the dict shares nothing mutable with the event."""
        d = {name: getattr(self, name) for name in _EVENT_FIELDS}
        d["group_ranks"] = list(self.group_ranks)
        d["metadata"] = copy.deepcopy(self.metadata) if self.metadata else {}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CommEvent:
        names = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in d.items() if k in names}
        kw["group_ranks"] = tuple(kw.get("group_ranks", ()))
        return cls(**kw)


_EVENT_FIELDS = tuple(f.name for f in fields(CommEvent))


def size_bucket(nbytes: int) -> int:
    """Power-of-two message-size bucket: the smallest 2**k >= nbytes (0 for 0 bytes)."""
    if nbytes <= 0:
        return 0
    return 1 << (int(nbytes) - 1).bit_length()


def size_bucket_array(nbytes: np.ndarray) -> np.ndarray:
    """Vectorized :func:`size_bucket`."""
    b = nbytes.astype(np.int64)
    out = np.zeros_like(b)
    pos = b > 0
    out[pos] = np.left_shift(1, np.ceil(np.log2(b[pos].astype(np.float64))).astype(np.int64))
    # guard float rounding at exact powers of two
    fix = pos & (out < b)
    out[fix] *= 2
    return out


class SpanKind(str, enum.Enum):
    """What a span measures."""

    STEP = "step"
    PHASE = "phase"

    def __str__(self) -> str:
        return self.value


SPAN_KINDS = ["step", "phase"]

#: Columnar layout of a timed span (a step or a phase inside a step), one per row.
SPAN_DTYPE = np.dtype(
    [
        ("kind", np.uint8),  # index into SPAN_KINDS
        ("status", np.uint8),  # STATUS_CODES: error when the span's block raised
        ("depth", np.uint8),  # nesting depth (a step is 0, its phases 1, nested phases 2 ...)
        ("name", np.uint16),  # index into the rank file's span-name table
        ("step", np.int32),  # step number the span belongs to (-1: outside any step)
        ("start_ns", np.int64),  # wall clock (this rank's clock, not yet aligned)
        ("duration_ns", np.int64),
        ("tokens", np.int64),  # steps only: tokens processed (0 when unknown)
        ("samples", np.int64),  # steps only: samples processed (0 when unknown)
        ("cpu_ns", np.int64),  # CPU time of the recording thread inside the span (-1: unknown)
    ]
)

#: One memory sample, taken at the end of each step. Bytes; -1 when not available.
MEMORY_DTYPE = np.dtype(
    [
        ("step", np.int32),
        ("t_ns", np.int64),  # wall clock
        ("allocated", np.int64),  # CUDA: torch.cuda.memory_allocated
        ("reserved", np.int64),  # CUDA: torch.cuda.memory_reserved
        ("peak", np.int64),  # CUDA: max_memory_allocated (never reset by meshprof); CPU: peak RSS
        ("rss", np.int64),  # host resident set size (psutil)
        ("capacity", np.int64),  # device memory (CUDA) or host memory (CPU) in total
    ]
)

#: One step's totals on one rank (52 B), kept for the whole run even when the detailed rows of
#: its events and spans were rotated out of the run directory (:mod:`meshprof.rundir.step_totals`).
STEP_TOTALS_DTYPE = np.dtype(
    [
        ("step", np.int32),
        ("collectives", np.uint32),  # collectives issued in the step that completed
        ("tokens", np.uint32),  # tokens processed (0 when unknown)
        ("start_ns", np.int64),  # wall clock when the step began
        ("duration_ns", np.int64),
        ("comm_ns", np.int64),  # sum of those collectives' durations (busy, not exposed, time)
        ("comm_bytes", np.int64),  # sum of their input bytes
        ("memory_peak", np.int64),  # the step's memory sample: device peak, else host RSS (-1)
    ]
)

FINISH_REASONS = ["stop", "length", "abort", "error", "unfinished"]
"""Why a request ended, by code (REQUEST_DTYPE ``reason``), as vLLM's ``finished_reason``:
``stop`` (a stop token or string), ``length`` (the output-token limit), ``abort`` (cancelled by
the client or the server), ``error`` (it failed); ``unfinished``: still running when its rank
wrote its last data (no finish time)."""
FINISH_CODES = {name: i for i, name in enumerate(FINISH_REASONS)}

#: One serving request on the rank that served it (a row once it finished, or at the rank's
#: last write while still running). Wall clock ns of this rank (not aligned); -1: never
#: happened. The intervals between them are defined in docs/definitions.md (Serving).
REQUEST_DTYPE = np.dtype(
    [
        ("id", np.int64),  # request id (the RequestMonitor's handle, or the caller's integer id)
        ("arrival_ns", np.int64),  # the request reached the server (vLLM's arrival_time)
        ("queued_ns", np.int64),  # it entered the scheduler's queue (arrival unless given)
        ("scheduled_ns", np.int64),  # first scheduled: its prefill began
        ("first_token_ns", np.int64),  # its first output token was emitted
        ("last_token_ns", np.int64),  # its last output token was emitted
        ("finished_ns", np.int64),  # it finished (any reason)
        ("prompt_tokens", np.int32),
        ("output_tokens", np.int32),  # tokens emitted (the sum of its TOKEN_DTYPE rows' n)
        ("reason", np.uint8),  # FINISH_CODES
    ]
)

#: One emission of output tokens to one request (a serving step emits one per running request).
#: The gaps between a request's consecutive emissions are its inter-token latencies.
TOKEN_DTYPE = np.dtype(
    [
        ("id", np.int64),  # request id (REQUEST_DTYPE ``id``)
        ("t_ns", np.int64),  # wall clock when the tokens were emitted (this rank's clock)
        ("n", np.int32),  # tokens emitted at once (1, or more with speculative decoding)
    ]
)

#: The W3C ``traceparent`` a request came with (``RequestMonitor.begin(traceparent=...)``): one
#: row per request that carried a valid one, in the same serving chunk as its REQUEST_DTYPE row
#: (matched by id and arrival). Its OpenTelemetry span is that caller's child, in its trace.
REQUEST_TRACE_DTYPE = np.dtype(
    [
        ("id", np.int64),  # request id (REQUEST_DTYPE ``id``)
        ("arrival_ns", np.int64),  # its REQUEST_DTYPE ``arrival_ns`` (ids may be reused)
        ("trace_hi", np.uint64),  # the caller's 128-bit trace id, high 64 bits
        ("trace_lo", np.uint64),  # low 64 bits
        ("parent_span", np.uint64),  # the caller's span id: the request span's (remote) parent
        ("flags", np.uint8),  # the caller's trace flags (01: sampled)
    ]
)

STEP_KINDS = ("prefill", "decode", "mixed")
"""Names a serving loop gives its step spans (``StepMonitor.step(name=...)``): a forward that
computes prompts only, one that decodes one token per running request, or both at once
(continuous batching with chunked prefill). Other names: the kind is derived from the tokens
the step emitted (:mod:`meshprof.analyze.serve.steps`)."""

CHUNK_PHASES = {
    "forward_one_chunk": "pp_forward",
    "backward_one_chunk": "pp_backward",
    "backward_weight_one_chunk": "pp_backward_weight",
}
"""torch.distributed.pipelining stage method -> the phase name each of its calls is recorded as
(:mod:`meshprof.monitor.pipeline_hooks`)."""
PIPELINE_CHUNKS = tuple(CHUNK_PHASES.values())
"""Phase names of one micro-batch's forward / backward chunk (what the bubble is made of)."""
