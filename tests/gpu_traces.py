"""GPU-like torch.profiler (Kineto) traces, written the way Kineto writes them on a GPU: per step a
``ProfilerStep#N`` annotation; ``aten::`` ops launching kernels through ``cudaLaunchKernel``
(``correlation`` ties runtime call and kernel); computation kernels on stream 7, NCCL kernels on
stream 20 launched inside ``record_param_comms`` (partly overlapping computation), memcpy on
stream 9, memset on stream 7; random gaps (idle GPU); ``distributedInfo`` and
``baseTimeNanoseconds``. Used by the HTA oracle tests and benchmarks/hta_compare.py."""

from __future__ import annotations

import random
from typing import Any

BASE_NS = 1_750_000_000 * 10**9
COMPUTE_STREAM, COMM_STREAM, COPY_STREAM = 7, 20, 9


def make_gpu_trace(
    rank: int,
    world: int = 2,
    steps: int = 5,
    kernels: int = 40,
    seed: int = 0,
    slow_rank: int | None = None,
    slow: float = 1.25,
    named_kernels: bool = False,
    fractional: bool = False,
    scale: float = 1.0,
) -> dict[str, Any]:
    """One rank's trace. ``slow_rank`` computes ``slow`` × longer. With ``named_kernels`` the NCCL
    kernels carry their own ``Collective name`` (newer PyTorch); else only ``record_param_comms``
    has it. ``fractional`` gives times with ns digits (µs with 3 decimals). ``scale`` multiplies
    every GPU duration and host step."""
    rng = random.Random(seed * 1000 + rank)
    pid, tid = 1000 + rank, 1000 + rank
    ev: list[dict[str, Any]] = []
    corr = [1]
    f = 1.0 if rank != slow_rank else slow
    rng_uniform = rng.uniform

    def uniform(a: float, b: float) -> float:
        return rng_uniform(a, b) * scale

    def t(x: float) -> float | int:
        return round(x, 3) if fractional else round(x)

    def cpu(
        name: str, ts: float, dur: float, cat: str = "cpu_op", args: dict | None = None
    ) -> None:
        ev.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": t(ts),
                "dur": t(dur),
            }
            | ({"args": args} if args else {})
        )

    first_kernel: list[float] = []

    def gpu(name: str, cat: str, stream: int, ts: float, dur: float, c: int, extra: dict) -> None:
        first_kernel.append(ts)
        ev.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": t(ts),
                "dur": t(dur),
                "args": {"device": 0, "stream": stream, "correlation": c} | extra,
            }
        )

    def launch(ts: float, api: str = "cudaLaunchKernel") -> int:
        c = corr[0]
        corr[0] += 1
        cpu(api, ts, 4, cat="cuda_runtime", args={"correlation": c, "cbid": 211})
        return c

    cpu_t = 100.0
    free = {COMPUTE_STREAM: 0.0, COMM_STREAM: 0.0, COPY_STREAM: 0.0}
    for s in range(steps):
        step0 = cpu_t
        for k in range(kernels):
            op_ts = cpu_t
            if k % 10 == 9:  # a collective, launched inside record_param_comms
                coll = "allreduce" if k % 20 == 19 else "reduce_scatter"
                kname = (
                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
                    if coll == "allreduce"
                    else "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"
                )
                cpu(
                    "record_param_comms",
                    op_ts,
                    12,
                    args={
                        "Collective name": coll,
                        "In msg nelems": 4096,
                        "dtype": "Float",
                        "Group size": world,
                    },
                )
                c = launch(op_ts + 3)
                st = max(op_ts + 8, free[COMM_STREAM])
                dur = uniform(60, 220)
                extra = {"Collective name": coll} if named_kernels else {}
                gpu(kname, "kernel", COMM_STREAM, st, dur, c, extra)
                free[COMM_STREAM] = st + dur
            elif k % 13 == 5:  # a host-to-device copy
                cpu("aten::copy_", op_ts, 10)
                c = launch(op_ts + 2, "cudaMemcpyAsync")
                st = max(op_ts + 6, free[COPY_STREAM])
                dur = uniform(15, 60)
                gpu("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", COPY_STREAM, st, dur, c, {})
                free[COPY_STREAM] = st + dur
            elif k % 17 == 3:  # a memset on the compute stream
                cpu("aten::zero_", op_ts, 8)
                c = launch(op_ts + 2, "cudaMemsetAsync")
                st = max(op_ts + 5, free[COMPUTE_STREAM])
                dur = uniform(3, 10)
                gpu("Memset (Device)", "gpu_memset", COMPUTE_STREAM, st, dur, c, {})
                free[COMPUTE_STREAM] = st + dur
            else:
                name = "aten::mm" if k % 2 else "aten::add_"
                kname = (
                    "ampere_sgemm_128x64_tn"
                    if k % 2
                    else "void at::native::vectorized_elementwise_kernel<4>"
                )
                cpu(name, op_ts, 10)
                c = launch(op_ts + 3)
                gap = rng.choice([0, 0, 0, 2, 5, 40])  # back-to-back, small and large gaps
                st = max(op_ts + 7, free[COMPUTE_STREAM] + gap)
                dur = uniform(20, 90) * f
                gpu(kname, "kernel", COMPUTE_STREAM, st, dur, c, {})
                free[COMPUTE_STREAM] = st + dur
            cpu_t += uniform(14, 30)
        if s % 2 == 1:
            cpu_t = max(cpu_t, free[COMPUTE_STREAM]) + 150  # a synchronize: a long idle gap
            cpu("cudaDeviceSynchronize", cpu_t - 150, 140, cat="cuda_runtime")
        cpu(f"ProfilerStep#{s}", step0 - 1, cpu_t - step0 + 1, cat="user_annotation")
        # Kineto's GPU-side copy of the step: from its first kernel to its last one's end
        g0 = min(first_kernel)
        first_kernel.clear()
        ev.append(
            {
                "ph": "X",
                "cat": "gpu_user_annotation",
                "name": f"ProfilerStep#{s}",
                "pid": 0,
                "tid": COMPUTE_STREAM,
                "ts": t(g0),
                "dur": t(max(free.values()) - g0),
                "args": {"External id": s},
            }
        )
        cpu_t += 5
    ev.append(
        {
            "ph": "X",
            "cat": "Trace",
            "name": "PyTorch Profiler (0)",
            "pid": "Spans",
            "tid": "x",
            "ts": 0,
            "dur": t(cpu_t),
        }
    )
    ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "main"}})
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "deviceProperties": [],
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": ev,
        "displayTimeUnit": "ms",
    }
