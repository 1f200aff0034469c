"""Added cost per collective of the default recorder, measured so that a noisy machine can still
resolve a fraction of a microsecond.

    python benchmarks/default_cost.py [--batch 500] [--rounds 60] [--workload fake|gloo1|nccl1]
    python benchmarks/default_cost.py --loop 1000000 --mode default   # one mode, whole process

Paired batches in one process: each round times one batch of ``--batch`` calls per mode, the
modes in a fresh random order every round, and keeps two figures per batch:

* **thread CPU** (``time.thread_time_ns`` of the calling thread around the batch, ns per call):
  what the calling thread spent, blind to time it was descheduled (other jobs, steal time) —
  the figure that stays put on a shared machine;
* **wall** (``time.perf_counter_ns`` around the batch, ns per call).

Modes: ``disabled`` (PyTorch alone), ``floor`` (the native kernels installed with
``enabled=False``: every collective still goes through them, and the C++ ``Work.wait``),
``default`` (the default recorder: typed kernels at BackendSelect and the unboxed autograd
passthrough), ``default-typed`` (typed kernels, PyTorch's boxed autograd fallback:
``MESHPROF_NATIVE_AUTOGRAD=0``), ``default-boxed`` (one boxed kernel for every op, the native
recorder before both: ``MESHPROF_NATIVE_TYPED=0``), ``python`` (``native=False``) and, with
``--workload nccl1`` (a one-rank NCCL group on this process's GPU, 4 float32 on the device,
each batch ending in a device synchronize), ``native`` (``native=True``: the C++ kernel with its
own CUDA events, where ``default`` is the kernel chosen for CUDA).

PyTorch alone boxes every c10d call at the autograd key (its autograd fallback, a boxed kernel,
runs for these ops); the default recorder replaces that with an unboxed passthrough, so its
figure against ``disabled`` is the recording's cost minus the boxing it saves: ``floor`` shows
that saving on its own (below zero), ``default − floor`` is the recording.

The added cost of a mode is the **median over rounds of (mode − disabled)** for the same round,
with a 95% confidence interval of that median from order statistics (distribution-free:
the ranks ``n/2 ± 0.98·√n`` of the sorted paired differences). Drift between rounds cancels
in the pairs; descheduling drops out of the CPU figure.

On the fake backend (PyTorch's ``fake`` process group: no communication, completed futures)
the calling thread does all of the recorder's work — the native kernel runs its completion
callback inline — so the thread-CPU difference is the whole per-collective cost; on a one-rank
gloo group part of it runs on gloo's thread (not in the calling thread's CPU; see
``record_cost.py``'s "other threads' CPU" column).

``--loop N --mode M`` runs N calls in mode M and exits: time two such processes as wholes
(``/usr/bin/time -v`` or any A/B harness) and divide the difference of their CPU seconds by N
for a figure from outside the process. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import math
import platform
import random
import time
from typing import Any

import numpy as np

MODES = ("disabled", "floor", "default", "default-typed", "default-boxed", "python")
CUDA_MODES = ("disabled", "default", "native", "python")
_DEVICE = ["cpu"]


def _set_mode(mode: str) -> str:
    """Install ``mode`` (after removing any recorder); returns the kernel that records."""
    import os

    import meshprof

    meshprof.reset()
    # "-typed": typed kernels without the autograd passthrough; "-boxed": one boxed C++ kernel
    # for every op (the native kernel before both)
    os.environ["MESHPROF_NATIVE_TYPED"] = "0" if mode.endswith("-boxed") else "1"
    os.environ["MESHPROF_NATIVE_AUTOGRAD"] = "1" if "-" not in mode else "0"
    mode = mode.removesuffix("-boxed").removesuffix("-typed")
    if mode == "default":
        return meshprof.enable(meshprof.ProfilerConfig(max_events=100_000)).backend_name
    if mode == "floor":  # the native kernel installed but recording nothing: boxed dispatch
        # through a C++ kernel and the C++ Work.wait, the floor of any dispatcher-level hook
        return meshprof.enable(
            meshprof.ProfilerConfig(max_events=100_000, enabled=False)
        ).backend_name
    if mode == "native":
        return meshprof.enable(
            meshprof.ProfilerConfig(max_events=100_000, native=True)
        ).backend_name
    if mode == "python":
        return meshprof.enable(
            meshprof.ProfilerConfig(max_events=100_000, native=False)
        ).backend_name
    return ""


def _batch(n: int) -> tuple[int, int]:
    """(thread CPU ns, wall ns) of ``n`` blocking all_reduces of 4 float32."""
    import torch
    import torch.distributed as dist

    t = torch.ones(4, device=_DEVICE[0])
    all_reduce = dist.all_reduce
    sync = torch.cuda.synchronize if _DEVICE[0] == "cuda" else (lambda: None)
    sync()
    c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
    for _ in range(n):
        all_reduce(t)
    sync()
    return time.thread_time_ns() - c0, time.perf_counter_ns() - w0


def _median_ci(d: np.ndarray) -> tuple[float, float, float]:
    """Median of ``d`` and its distribution-free 95% interval (order statistics)."""
    s = np.sort(d)
    n = len(s)
    half = 0.98 * math.sqrt(n)
    lo = max(math.floor(n / 2 - half), 0)
    hi = min(math.ceil(n / 2 + half), n - 1)
    return float(np.median(s)), float(s[lo]), float(s[hi])


def measure(batch: int, rounds: int, modes: tuple[str, ...], seed: int = 0) -> dict[str, Any]:
    """Per mode, per round: (CPU ns/call, wall ns/call); plus the default mode's kernel."""
    rng = random.Random(seed)
    out: dict[str, Any] = {m: [] for m in modes}
    kernel = ""
    for m in modes:  # warm-up, discarded
        k = _set_mode(m)
        kernel = k if m == "default" else kernel
        _batch(min(batch, 200))
    for _ in range(rounds):
        order = list(modes)
        rng.shuffle(order)
        for m in order:
            _set_mode(m)
            _batch(20)  # the first calls after an install touch cold state: not timed
            cpu, wall = _batch(batch)
            out[m].append((cpu / batch, wall / batch))
    _set_mode("disabled")
    out["kernel"] = kernel
    return out


def _init(workload: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if workload == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    elif workload == "nccl1":
        from meshprof.launch.spawn import free_port

        torch.cuda.set_device(0)
        _DEVICE[0] = "cuda"
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    else:
        from meshprof.launch.spawn import free_port

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )


def table(res: dict[str, Any], modes: tuple[str, ...]) -> str:
    base = np.asarray(res["disabled"])
    lines = [
        "| mode | CPU ns/call (median) | added CPU ns (median, 95% CI) "
        "| wall ns/call (median) | added wall ns (median, 95% CI) |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in modes:
        v = np.asarray(res[m])
        cpu, wall = np.median(v[:, 0]), np.median(v[:, 1])
        if m == "disabled":
            lines.append(f"| {m} | {cpu:.0f} | | {wall:.0f} | |")
            continue
        dc = _median_ci(v[:, 0] - base[:, 0])
        dw = _median_ci(v[:, 1] - base[:, 1])
        lines.append(
            f"| {m} | {cpu:.0f} | {dc[0]:+.0f} ({dc[1]:+.0f} to {dc[2]:+.0f}) | {wall:.0f} "
            f"| {dw[0]:+.0f} ({dw[1]:+.0f} to {dw[2]:+.0f}) |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description="added cost per collective, paired batches")
    ap.add_argument("--batch", type=int, default=500, help="calls per mode per round")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--workload", choices=("fake", "gloo1", "nccl1"), default="fake")
    ap.add_argument("--no-python", action="store_true", help="leave out the Python kernel")
    ap.add_argument("--loop", type=int, default=0, help="whole-process mode: N calls, then exit")
    ap.add_argument("--mode", choices=(*MODES, "native"), default="default")
    args = ap.parse_args()
    _init(args.workload)
    if args.loop:
        kernel = _set_mode(args.mode)
        _batch(args.loop)
        print(f"{args.loop} calls, mode {args.mode} ({kernel or 'no recorder'})")
        return
    import torch

    modes = CUDA_MODES if args.workload == "nccl1" else MODES
    modes = tuple(m for m in modes if m != "python") if args.no_python else modes
    res = measure(args.batch, args.rounds, modes)
    print(
        f"machine: {platform.processor() or platform.machine()}, {platform.system()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}; workload "
        f"{args.workload}; {args.rounds} rounds × {args.batch} calls per mode; default "
        f"kernel: {res['kernel'] or '?'}"
    )
    print(table(res, modes))


if __name__ == "__main__":
    main()
