"""What each c10d dispatcher op is, and where its tensors, group and peer sit in its arguments.

Every collective in PyTorch, whatever path issued it (``torch.distributed`` functions, the
``ProcessGroup`` methods, DDP's C++ reducer, FSDP2, DTensor's functional collectives, pipelining),
ends in one of these ``c10d::`` operators. Their argument layout comes from the op schemas
(``torch._C._jit_get_all_schemas()``). This is the one table of those layouts: the Python kernel
reads arguments through it and the native kernel is configured from it (:meth:`OpSpec.native_row`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


def _nbytes(t: Any) -> int:
    return t.nbytes  # type: ignore[no-any-return]


def _sum_bytes(ts: Sequence[Any]) -> int:
    if len(ts) == 1:  # the common case, on the hot path
        return ts[0].nbytes  # type: ignore[no-any-return]
    n = 0
    for t in ts:
        n += t.nbytes
    return n


def _sum_bytes2(tss: Sequence[Sequence[Any]]) -> int:
    n = 0
    for ts in tss:
        for t in ts:
            n += t.nbytes
    return n


def _first(x: Any) -> Any:
    """First tensor in a tensor, a list of tensors or a list of lists (None if empty)."""
    while isinstance(x, (list, tuple)):
        if not x:
            return None
        x = x[0]
    return x


#: How an argument holds its tensors: one tensor, a list, or a list of lists.
TENSOR, LIST, LISTS = "tensor", "list", "lists"

_COUNTERS: dict[str, Callable[[Any], int]] = {TENSOR: _nbytes, LIST: _sum_bytes, LISTS: _sum_bytes2}


def _byte_counter(arg: int, layout: str) -> Callable[[tuple[Any, ...]], int]:
    """The function that counts the bytes held by argument ``arg`` (-1: none) of an op."""
    if arg < 0:
        return lambda a: 0
    count = _COUNTERS[layout]
    return lambda a: count(a[arg])


@dataclass(frozen=True, slots=True)
class OpSpec:
    """How to read one ``c10d::`` op's arguments (both kernels read them from this table)."""

    schema_name: str
    """The op's name in the c10d namespace, e.g. "allreduce_"."""
    op: str
    """The meshprof op name (:class:`meshprof.events.OpType` value)."""
    pg: int
    """Argument index of the ProcessGroup."""
    in_arg: int
    """Argument index of the input tensors (-1: none)."""
    in_layout: str
    """How ``in_arg`` holds them: TENSOR, LIST or LISTS."""
    out_arg: int
    """Argument index of the output tensors (-1: none)."""
    out_layout: str
    """How ``out_arg`` holds them."""
    tensor_arg: int
    """Argument index holding a tensor (or list) whose dtype and device stand for the op."""
    async_arg: int | None = None
    """Argument index of ``async_op`` (None: the op has none and is always asynchronous)."""
    peer_arg: int | None = None
    """Argument index of the peer's group rank (send/recv)."""
    coalesced: bool = False
    """The op carries several tensors issued as one collective."""
    p2p: bool = field(init=False)
    """A point-to-point op: numbered per peer pair and direction, not per group (derived)."""
    caller_completes: bool = field(init=False)
    """On a backend whose work for this op has no future (gloo's reduce_scatter: a ``LambdaWork``
    that waits for its all-reduces and copies the result into the output *inside* ``wait()``),
    the op completes when its caller waits: ``Work.wait()`` in Python or
    ``_c10d_functional.wait_tensor``. meshprof never waits on such a work itself: a second
    ``wait()`` runs that copy again, bumping the output's version counter (selective activation
    checkpointing then refuses the cached output) and writing it behind the caller's back
    (derived)."""
    in_bytes: Callable[[tuple[Any, ...]], int] = field(init=False)
    """Bytes of the input tensors, from the op's arguments (derived)."""
    out_bytes: Callable[[tuple[Any, ...]], int] = field(init=False)
    """Bytes of the output tensors (derived)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "p2p", self.op in ("send", "recv"))
        object.__setattr__(self, "caller_completes", self.op == "reduce_scatter")
        object.__setattr__(self, "in_bytes", _byte_counter(self.in_arg, self.in_layout))
        object.__setattr__(self, "out_bytes", _byte_counter(self.out_arg, self.out_layout))

    def native_row(self, op_code: int) -> tuple[int | str, ...]:
        """This spec as one row of the native kernel's table (see ``configure`` in
        native_kernel.cpp): name, op code, pg, in, out, tensor, async, peer argument indices
        (-1: none), p2p (0 collective, 1 send, 2 recv), completed by the caller's wait (0/1)."""
        return (
            self.schema_name,
            op_code,
            self.pg,
            self.in_arg,
            self.out_arg,
            self.tensor_arg,
            -1 if self.async_arg is None else self.async_arg,
            -1 if self.peer_arg is None else self.peer_arg,
            (1 if self.op == "send" else 2) if self.p2p else 0,
            int(self.caller_completes),
        )


NO_ARG = -1
# fmt: off
SPECS: tuple[OpSpec, ...] = (
    #       schema name                          op                pg  in  layout  out  layout  tensor
    OpSpec("allreduce_",                        "all_reduce",     1,  0, LIST,   0, LIST,   0, async_arg=4),
    OpSpec("allreduce_coalesced_",              "all_reduce",     1,  0, LIST,   0, LIST,   0, async_arg=3, coalesced=True),
    OpSpec("allgather_",                        "all_gather",     2,  1, LIST,   0, LISTS,  1, async_arg=3),
    OpSpec("_allgather_base_",                  "all_gather",     2,  1, TENSOR, 0, TENSOR, 1, async_arg=3),
    OpSpec("allgather_coalesced_",              "all_gather",     2,  1, LIST,   0, LISTS,  1, async_arg=3, coalesced=True),
    OpSpec("allgather_into_tensor_coalesced_",  "all_gather",     2,  1, LIST,   0, LIST,   1, async_arg=3, coalesced=True),
    OpSpec("reduce_scatter_",                   "reduce_scatter", 2,  1, LISTS,  0, LIST,   0, async_arg=4),
    OpSpec("_reduce_scatter_base_",             "reduce_scatter", 2,  1, TENSOR, 0, TENSOR, 0, async_arg=4),
    OpSpec("reduce_scatter_tensor_coalesced_",  "reduce_scatter", 2,  1, LIST,   0, LIST,   0, async_arg=4, coalesced=True),
    OpSpec("broadcast_",                        "broadcast",      1,  0, LIST,   0, LIST,   0, async_arg=4),
    OpSpec("reduce_",                           "reduce",         1,  0, LIST,   0, LIST,   0, async_arg=5),
    OpSpec("gather_",                           "gather",         2,  1, LIST,   0, LISTS,  1, async_arg=4),
    OpSpec("scatter_",                          "scatter",        2,  1, LISTS,  0, LIST,   0, async_arg=4),
    OpSpec("alltoall_",                         "all_to_all",     2,  1, LIST,   0, LIST,   1, async_arg=3),
    OpSpec("alltoall_base_",                    "all_to_all",     2,  1, TENSOR, 0, TENSOR, 1, async_arg=5),
    OpSpec("barrier",                           "barrier",        1, NO_ARG, LIST, NO_ARG, LIST,   0, async_arg=3),
    OpSpec("monitored_barrier_",                "barrier",        1, NO_ARG, LIST, NO_ARG, LIST,   0),
    OpSpec("send",                              "send",           1,  0, LIST, NO_ARG, LIST,   0, peer_arg=2),
    OpSpec("recv_",                             "recv",           1, NO_ARG, LIST,  0, LIST,   0, peer_arg=2),
    OpSpec("recv_any_source_",                  "recv",           1, NO_ARG, LIST,  0, LIST,   0),
)
# fmt: on


def available_specs() -> list[OpSpec]:
    """The specs whose op exists in this PyTorch build."""
    ns = torch.ops.c10d
    out = []
    for spec in SPECS:
        try:
            getattr(ns, spec.schema_name).default  # noqa: B018
        except (AttributeError, RuntimeError):
            continue
        out.append(spec)
    return out


def output_tensors(spec: OpSpec, args: tuple[Any, ...]) -> list[Any]:
    """The tensors of the op's output argument (empty: it has none)."""
    if spec.out_arg < 0:
        return []
    x = args[spec.out_arg]
    if spec.out_layout == TENSOR:
        return [x]
    if spec.out_layout == LIST:
        return list(x)
    return [t for ts in x for t in ts]


def first_tensor(spec: OpSpec, args: tuple[Any, ...]) -> Any:
    """The tensor whose dtype and device stand for the op (None: it has none)."""
    return _first(args[spec.tensor_arg])
