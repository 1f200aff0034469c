"""What each c10d dispatcher op is, and where its tensors, group and peer sit in its arguments.

Every collective in PyTorch, whatever path issued it (``torch.distributed`` functions, the
``ProcessGroup`` methods, DDP's C++ reducer, FSDP2, DTensor's functional collectives, pipelining),
ends in one of these ``c10d::`` operators. Their argument layout comes from the op schemas
(``torch._C._jit_get_all_schemas()``).
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


@dataclass(frozen=True, slots=True)
class OpSpec:
    """How to read one ``c10d::`` op's arguments."""

    schema_name: str
    """The op's name in the c10d namespace, e.g. "allreduce_"."""
    op: str
    """The meshprof op name (:class:`meshprof.events.OpType` value)."""
    pg: int
    """Argument index of the ProcessGroup."""
    in_bytes: Callable[[tuple[Any, ...]], int]
    out_bytes: Callable[[tuple[Any, ...]], int]
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "p2p", self.op in ("send", "recv"))


SPECS: tuple[OpSpec, ...] = (
    OpSpec(
        "allreduce_",
        "all_reduce",
        1,
        lambda a: _sum_bytes(a[0]),
        lambda a: _sum_bytes(a[0]),
        0,
        async_arg=4,
    ),
    OpSpec(
        "allreduce_coalesced_",
        "all_reduce",
        1,
        lambda a: _sum_bytes(a[0]),
        lambda a: _sum_bytes(a[0]),
        0,
        async_arg=3,
        coalesced=True,
    ),
    OpSpec(
        "allgather_",
        "all_gather",
        2,
        lambda a: _sum_bytes(a[1]),
        lambda a: _sum_bytes2(a[0]),
        1,
        async_arg=3,
    ),
    OpSpec(
        "_allgather_base_",
        "all_gather",
        2,
        lambda a: _nbytes(a[1]),
        lambda a: _nbytes(a[0]),
        1,
        async_arg=3,
    ),
    OpSpec(
        "allgather_coalesced_",
        "all_gather",
        2,
        lambda a: _sum_bytes(a[1]),
        lambda a: _sum_bytes2(a[0]),
        1,
        async_arg=3,
        coalesced=True,
    ),
    OpSpec(
        "allgather_into_tensor_coalesced_",
        "all_gather",
        2,
        lambda a: _sum_bytes(a[1]),
        lambda a: _sum_bytes(a[0]),
        1,
        async_arg=3,
        coalesced=True,
    ),
    OpSpec(
        "reduce_scatter_",
        "reduce_scatter",
        2,
        lambda a: _sum_bytes2(a[1]),
        lambda a: _sum_bytes(a[0]),
        0,
        async_arg=4,
    ),
    OpSpec(
        "_reduce_scatter_base_",
        "reduce_scatter",
        2,
        lambda a: _nbytes(a[1]),
        lambda a: _nbytes(a[0]),
        0,
        async_arg=4,
    ),
    OpSpec(
        "reduce_scatter_tensor_coalesced_",
        "reduce_scatter",
        2,
        lambda a: _sum_bytes(a[1]),
        lambda a: _sum_bytes(a[0]),
        0,
        async_arg=4,
        coalesced=True,
    ),
    OpSpec(
        "broadcast_",
        "broadcast",
        1,
        lambda a: _sum_bytes(a[0]),
        lambda a: _sum_bytes(a[0]),
        0,
        async_arg=4,
    ),
    OpSpec(
        "reduce_",
        "reduce",
        1,
        lambda a: _sum_bytes(a[0]),
        lambda a: _sum_bytes(a[0]),
        0,
        async_arg=5,
    ),
    OpSpec(
        "gather_",
        "gather",
        2,
        lambda a: _sum_bytes(a[1]),
        lambda a: _sum_bytes2(a[0]),
        1,
        async_arg=4,
    ),
    OpSpec(
        "scatter_",
        "scatter",
        2,
        lambda a: _sum_bytes2(a[1]),
        lambda a: _sum_bytes(a[0]),
        0,
        async_arg=4,
    ),
    OpSpec(
        "alltoall_",
        "all_to_all",
        2,
        lambda a: _sum_bytes(a[1]),
        lambda a: _sum_bytes(a[0]),
        1,
        async_arg=3,
    ),
    OpSpec(
        "alltoall_base_",
        "all_to_all",
        2,
        lambda a: _nbytes(a[1]),
        lambda a: _nbytes(a[0]),
        1,
        async_arg=5,
    ),
    OpSpec("barrier", "barrier", 1, lambda a: 0, lambda a: 0, 0, async_arg=3),
    OpSpec("monitored_barrier_", "barrier", 1, lambda a: 0, lambda a: 0, 0),
    OpSpec("send", "send", 1, lambda a: _sum_bytes(a[0]), lambda a: 0, 0, peer_arg=2),
    OpSpec("recv_", "recv", 1, lambda a: 0, lambda a: _sum_bytes(a[0]), 0, peer_arg=2),
    OpSpec("recv_any_source_", "recv", 1, lambda a: 0, lambda a: _sum_bytes(a[0]), 0),
)


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


def tensor_of(spec: OpSpec, args: tuple[Any, ...]) -> Any:
    return _first(args[spec.tensor_arg])
