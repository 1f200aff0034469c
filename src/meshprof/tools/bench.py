"""``meshprof bench``: collective bandwidth, measured the way nccl-tests measures it.

Per op and size: ``warmup`` untimed iterations, a barrier, then ``iters`` timed iterations of the
plain torch call (the meshprof recorder is switched off meanwhile). The time of a size is the
loop's wall time / iters on each rank (CUDA: events on the current stream), combined across ranks
(avg, min, max); the per-iteration times (the slowest rank's, per iteration) give min, max, p99 and
cv%. algbw / busbw come from :func:`meshprof.events.bandwidth_gbps`, so the definitions live in one
place. Each size is then run once more on fresh inputs holding rank-dependent values and the
output is compared exactly with the expected values (#wrong elements, summed over ranks).

``size`` is nccl-tests' S: the full buffer for all_reduce/broadcast/reduce, the gathered output for
all_gather/gather, the unscattered input for reduce_scatter/scatter, the send buffer for
all_to_all, the message for send/recv.

This module measures and returns :class:`BenchResult`; :mod:`meshprof.render.bench` turns it into
the table, CSV and SVG.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from meshprof.errors import MeshprofError
from meshprof.events import bandwidth_gbps

ALL_OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "gather",
    "scatter",
    "sendrecv",
)
#: Ops that torch offers both in place and out of place (the others have one form).
_BOTH = frozenset({"all_gather", "reduce_scatter"})
_IN_PLACE_ONLY = frozenset({"all_reduce", "broadcast", "reduce"})
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'1K' -> 1024, '8M' -> 8 MiB, '1G', '4096' (bytes; nccl-tests' suffixes are powers of 2)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise MeshprofError(
            f"bad size {text!r}: use a number of bytes with an optional K, M or G suffix, e.g. 1K or 64M"
        )
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def size_list(begin: int, end: int, factor: float) -> list[int]:
    """begin, begin*factor, ... up to end (inclusive)."""
    if begin <= 0 or end < begin:
        raise MeshprofError(f"bad size range {begin}..{end}: need 0 < -b <= -e")
    if factor <= 1 and begin != end:
        raise MeshprofError(f"bad step factor {factor}: -f must be > 1")
    out: list[int] = []
    s = float(begin)
    while s <= end and len(out) < 64:
        out.append(int(s))
        s *= factor
    return out


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What to benchmark."""

    ops: tuple[str, ...] = ALL_OPS
    """Ops to run, in order."""
    sizes: tuple[int, ...] = (1 << 20,)
    """nccl-tests sizes S in bytes."""
    dtype: str = "float32"
    """Element type."""
    warmup: int = 5
    """Untimed iterations per size."""
    iters: int = 20
    """Timed iterations per size."""
    check: bool = True
    """Run the correctness check."""
    modes: tuple[str, ...] = ("out-of-place", "in-place")
    """Buffer modes to run where torch offers both."""

    def __post_init__(self) -> None:
        bad = [o for o in self.ops if o not in ALL_OPS]
        if bad:
            raise MeshprofError(f"unknown op {bad[0]!r}: choose from {', '.join(ALL_OPS)}")
        if self.dtype not in DTYPES:
            raise MeshprofError(f"unknown dtype {self.dtype!r}: choose from {', '.join(DTYPES)}")
        if self.iters < 1 or self.warmup < 0:
            raise MeshprofError("iterations must be >= 1 and warm-up >= 0")


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One (op, size, mode) measurement, combined across ranks."""

    op: str
    """Op name ("sendrecv" is a ring: rank r sends to r+1 and receives from r-1)."""
    mode: str
    """"out-of-place" or "in-place"."""
    size: int
    """nccl-tests size S in bytes."""
    count: int
    """Elements per rank in the op's (per-rank) input."""
    dtype: str
    """Element type."""
    world_size: int
    """Ranks in the group."""
    time_us: float
    """Mean iteration time (µs), averaged over ranks."""
    time_min_us: float
    """The fastest rank's mean iteration time (µs)."""
    time_max_us: float
    """The slowest rank's mean iteration time (µs)."""
    algbw: float
    """S / time_us, GB/s."""
    busbw: float
    """algbw × the op's bus factor, GB/s."""
    iter_min_us: float
    """Fastest iteration (slowest rank per iteration), µs."""
    iter_max_us: float
    """Slowest iteration, µs."""
    iter_p99_us: float
    """99th percentile of the iterations, µs."""
    cv_pct: float
    """Coefficient of variation of the iterations, %."""
    wrong: int
    """Elements that differed from the expected result, summed over ranks (-1: not checked)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Everything a bench run measured."""

    rows: tuple[BenchRow, ...]
    """One row per (op, size, mode)."""
    backend: str
    """Process group backend."""
    device: str
    """"cpu" or "cuda"."""
    world_size: int
    """Ranks."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Settings: warm-up, iterations, dtype, torch version."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device": self.device,
            "world_size": self.world_size,
            "meta": self.meta,
            "rows": [r.to_dict() for r in self.rows],
        }


# -- per-op buffers and expected values -------------------------------------------------------
def _pattern(torch: Any, count: int, dtype: Any, device: Any) -> Any:
    """1, 2, 3, 1, 2, 3, ...: small integers, exact in every dtype even after summing ranks."""
    return (torch.arange(count, device=device) % 3 + 1).to(dtype)


class CollectiveCase:
    """Buffers and the call of one op in one mode; ``expected()`` is this rank's correct output."""

    def __init__(
        self,
        torch: Any,
        dist: Any,
        op: str,
        mode: str,
        size: int,
        dtype: Any,
        device: Any,
        rank: int,
        n: int,
    ) -> None:
        self.torch, self.dist, self.op, self.mode = torch, dist, op, mode
        self.rank, self.n, self.dtype, self.device = rank, n, dtype, device
        elem = torch.empty((), dtype=dtype).element_size()
        total = max(size // elem, n)
        chunked = op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")
        if chunked:
            total -= total % n
        self.total = total
        self.chunk = total // n if chunked else total
        self.reset()

    def reset(self) -> None:
        torch, op, r, n, c, dev = self.torch, self.op, self.rank, self.n, self.chunk, self.device
        pat_full = _pattern(torch, self.total, self.dtype, dev)
        if op in ("all_reduce", "reduce", "broadcast", "sendrecv"):
            self.inp = pat_full * (r + 1)
            self.out = torch.zeros_like(self.inp) if op == "sendrecv" else self.inp
        elif op in ("all_gather", "gather"):
            self.out = torch.zeros(self.total, dtype=self.dtype, device=dev)
            if self.mode == "in-place":
                self.out[r * c : (r + 1) * c] = _pattern(torch, c, self.dtype, dev) * (r + 1)
                self.inp = self.out[r * c : (r + 1) * c]
            else:
                self.inp = _pattern(torch, c, self.dtype, dev) * (r + 1)
            self.outs = list(self.out.split(c)) if op == "gather" and r == 0 else None
        elif op in ("reduce_scatter", "scatter"):
            self.inp = pat_full * (r + 1)
            self.out = (
                self.inp[r * c : (r + 1) * c]
                if self.mode == "in-place"
                else torch.zeros(c, dtype=self.dtype, device=dev)
            )
            self.ins = list(self.inp.split(c)) if op == "scatter" and r == 0 else None
        elif op == "all_to_all":
            # chunk j of rank r holds r*n + j + 1: exact, and says where every chunk came from
            self.inp = (torch.arange(self.total, device=dev) // c + r * n + 1).to(self.dtype)
            self.out = torch.zeros_like(self.inp)

    def in_out_bytes(self) -> tuple[int, int]:
        return int(self.inp.numel() * self.inp.element_size()), int(
            self.out.numel() * self.out.element_size()
        )

    def run(self) -> None:
        dist, op, r, n = self.dist, self.op, self.rank, self.n
        if op == "all_reduce":
            dist.all_reduce(self.inp)
        elif op == "broadcast":
            dist.broadcast(self.inp, 0)
        elif op == "reduce":
            dist.reduce(self.inp, 0)
        elif op == "all_gather":
            _all_gather_single(dist)(self.out, self.inp)
        elif op == "reduce_scatter":
            _reduce_scatter_single(dist)(self.out, self.inp)
        elif op == "all_to_all":
            dist.all_to_all_single(self.out, self.inp)
        elif op == "gather":
            dist.gather(self.inp, self.outs, dst=0)
        elif op == "scatter":
            dist.scatter(self.out, self.ins, src=0)
        elif op == "sendrecv":
            if n == 1:
                self.out.copy_(self.inp)
                return
            ops = [
                dist.P2POp(dist.isend, self.inp, (r + 1) % n),
                dist.P2POp(dist.irecv, self.out, (r - 1) % n),
            ]
            for w in dist.batch_isend_irecv(ops):
                w.wait()

    def wrong(self) -> int:
        """Elements of this rank's result that differ from the expected values."""
        torch, op, r, n, c, dev, dt = (
            self.torch,
            self.op,
            self.rank,
            self.n,
            self.chunk,
            self.device,
            self.dtype,
        )
        pat = _pattern(torch, self.total, dt, dev)
        tri = n * (n + 1) // 2
        if op == "all_reduce":
            got, want = self.inp, pat * tri
        elif op == "reduce":
            if r != 0:  # backends may use a non-root buffer as scratch space
                return 0
            got, want = self.inp, pat * tri
        elif op == "broadcast":
            got, want = self.inp, pat
        elif op == "sendrecv":
            got, want = self.out, pat * ((r - 1) % n + 1)
        elif op in ("all_gather", "gather"):
            if op == "gather" and r != 0:
                return 0
            pc = _pattern(torch, c, dt, dev)
            got, want = self.out, torch.cat([pc * (j + 1) for j in range(n)])
        elif op == "reduce_scatter":
            got, want = self.out, pat[r * c : (r + 1) * c] * tri
        elif op == "scatter":
            got, want = self.out, pat[r * c : (r + 1) * c]
        else:  # all_to_all: chunk s of rank r came from rank s's chunk r
            got, want = self.out, (torch.arange(self.total, device=dev) // c * n + r + 1).to(dt)
        return int((got != want).sum().item())


def _all_gather_single(dist: Any) -> Any:
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_single(dist: Any) -> Any:
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def modes_of(op: str, wanted: tuple[str, ...]) -> list[str]:
    if op in _BOTH:
        return [m for m in ("out-of-place", "in-place") if m in wanted]
    return ["in-place" if op in _IN_PLACE_ONLY else "out-of-place"]


# -- measuring -----------------------------------------------------------------------------------
def _time_loop(
    case: CollectiveCase, iters: int, cuda: bool, torch: Any
) -> tuple[float, np.ndarray]:
    """(mean ns per iteration over the whole loop, per-iteration ns)."""
    stamps = np.empty(iters + 1, dtype=np.int64)
    if cuda:
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record()
        for i in range(iters):
            case.run()
            events[i + 1].record()
        events[-1].synchronize()
        ms = np.array([events[0].elapsed_time(e) for e in events])
        stamps = (ms * 1e6).astype(np.int64)
    else:
        now = time.perf_counter_ns
        stamps[0] = now()
        for i in range(iters):
            case.run()
            stamps[i + 1] = now()
    return (stamps[-1] - stamps[0]) / iters, np.diff(stamps)


def run_bench_rank(rank: int, world_size: int, config: BenchConfig) -> BenchResult | None:
    """Run the benchmark on this rank of an initialized default process group. Every rank must
    call it with the same config; rank 0 gets the result, the others None."""
    import torch
    import torch.distributed as dist

    from meshprof.comm import active

    prof = active.get_profiler()
    was_on = prof is not None and prof.installed
    if was_on:
        active.disable()
    try:
        backend = str(dist.get_backend())
        cuda = backend == "nccl" and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        dtype = getattr(torch, config.dtype)
        rows = []
        for op in config.ops:
            for mode in modes_of(op, config.modes):
                for size in config.sizes:
                    case = CollectiveCase(
                        torch, dist, op, mode, size, dtype, device, rank, world_size
                    )
                    rows.append(_measure(case, config, cuda))
        if rank != 0:
            return None
        meta = {
            "warmup": config.warmup,
            "iters": config.iters,
            "dtype": config.dtype,
            "torch": torch.__version__,
            "check": config.check,
        }
        return BenchResult(
            tuple(r for r in rows if r is not None), backend, device.type, world_size, meta
        )
    finally:
        if was_on:
            active.enable()


def _measure(case: CollectiveCase, config: BenchConfig, cuda: bool) -> BenchRow | None:
    """Warm up, time and check one case; rank 0 gets the row combined across ranks."""
    torch, dist, op, n = case.torch, case.dist, case.op, case.n
    for _ in range(config.warmup):
        case.run()
    dist.barrier()
    mean_ns, per_iter = _time_loop(case, config.iters, cuda, torch)
    wrong = -1
    if config.check:
        case.reset()
        case.run()
        if cuda:
            torch.cuda.synchronize()
        wrong = case.wrong()
    # combine across ranks: [mean, wrong, per-iteration...] from every rank
    local = torch.tensor(
        [mean_ns, float(wrong), *per_iter.tolist()], dtype=torch.float64, device=case.device
    )
    table = [torch.zeros_like(local) for _ in range(n)]
    dist.all_gather(table, local)
    if case.rank != 0:
        return None
    m = torch.stack(table).cpu().numpy()
    means = m[:, 0]
    iters = m[:, 2:].max(axis=0)  # an iteration lasts as long as its slowest rank
    in_b, out_b = case.in_out_bytes()
    t_ns = float(means.mean())
    algbw, busbw = bandwidth_gbps(
        op if op != "sendrecv" else "send", in_b, out_b, max(round(t_ns), 1), n
    )
    mean_iter = float(iters.mean())
    return BenchRow(
        op=op,
        mode=case.mode,
        size=int(_nccl_size(op, in_b, out_b, n)),
        count=int(case.inp.numel()),
        dtype=config.dtype,
        world_size=n,
        time_us=t_ns / 1e3,
        time_min_us=float(means.min()) / 1e3,
        time_max_us=float(means.max()) / 1e3,
        algbw=algbw,
        busbw=busbw,
        iter_min_us=float(iters.min()) / 1e3,
        iter_max_us=float(iters.max()) / 1e3,
        iter_p99_us=float(np.percentile(iters, 99)) / 1e3,
        cv_pct=float(iters.std() / mean_iter * 100) if mean_iter > 0 else 0.0,
        wrong=int(m[:, 1].sum()) if config.check else -1,
    )


def _nccl_size(op: str, in_b: int, out_b: int, n: int) -> int:
    from meshprof.events import nccl_tests_size

    return nccl_tests_size(op if op != "sendrecv" else "send", in_b, out_b, n)


__all__ = [
    "ALL_OPS",
    "BenchConfig",
    "BenchResult",
    "BenchRow",
    "CollectiveCase",
    "modes_of",
    "parse_size",
    "run_bench_rank",
    "size_list",
]
