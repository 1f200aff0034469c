"""GPU proof of the native recorder's device timing: NCCL all_reduce of known sizes, timed by
meshprof's native kernel, its Python kernel and torch.profiler's NCCL kernel times.

    python benchmarks/gpu_native_check.py [--ranks 1|2] [--iters 20] [--out result.json]

Needs CUDA, NCCL and (for the native kernel's CUDA build) the CUDA toolkit (``CUDA_HOME``).
Runs, per rank count (one GPU per rank):

  python         meshprof's Python kernel (CUDA events recorded from Python)
  native         the C++ kernel with its own CUDA events
  native-timing  the C++ kernel with TORCH_NCCL_ENABLE_TIMING=1 (ProcessGroupNCCL's own start/end
                 events, ``Work::getDuration()``)

For each mode and message size it prints the median of meshprof's ``duration_ns`` (device),
``metadata.host_duration_ns`` (host issue -> completion) and torch.profiler's NCCL kernel
duration, the ratio device/kernel, and whether the recording path synchronized the host
(a pass under ``torch.cuda.set_sync_debug_mode("error")``). Exit status 1 when a check fails:
every op recorded once, device-timed (``host_duration_ns`` present), no host synchronization,
and device time >= 0.9 x the kernel time and <= kernel time + 1 ms (the events bracket the
kernel plus the stream waits around it; with one rank NCCL launches no all-reduce kernel, so
that comparison needs two GPUs). Prints a table; nothing here is a unit test.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from typing import Any

SIZES = (1 << 20, 16 << 20, 64 << 20)  # bytes of float32 per all_reduce
MODES = ("python", "native", "native-timing")


def _kernel_durations_us(prof: Any) -> list[float]:
    """torch.profiler's NCCL all-reduce kernels (device side, from its Chrome trace: the
    kernels are not all among ``prof.events()`` in every torch version), in issue order."""
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            doc = json.load(f)
    finally:
        os.unlink(path)
    out = []
    for e in doc.get("traceEvents", []):
        name = str(e.get("name", "")).lower()
        if e.get("cat") == "kernel" and "nccl" in name and "allreduce" in name:
            out.append((float(e.get("ts", 0)), float(e.get("dur", 0))))
    return [d for _s, d in sorted(out)]


def _worker(rank: int, ws: int, mode: str, iters: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import meshprof

    torch.cuda.set_device(rank)
    prof = meshprof.enable(meshprof.ProfilerConfig(native=mode != "python"))
    res: dict[str, Any] = {"backend": prof.backend_name, "sizes": {}}
    for size in SIZES:
        t = torch.ones(size // 4, device="cuda")
        for _ in range(3):  # warm up NCCL and the allocator
            dist.all_reduce(t)
        torch.cuda.synchronize()
        prof.settle(2.0)
        start = prof.log.total
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
        prof.settle(5.0)
        evs = [e for e in prof.events(start) if e.op == "all_reduce"]
        # the recording path alone, under the sync checker (the profiler is not)
        start2 = prof.log.total
        torch.cuda.set_sync_debug_mode("error")
        synced = ""
        try:
            for _ in range(iters):
                dist.all_reduce(t)
        except RuntimeError as e:
            synced = str(e)[:200]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        prof.settle(5.0)
        res["sizes"][size] = {
            "n": len(evs),
            "n_sync_pass": len([e for e in prof.events(start2) if e.op == "all_reduce"]),
            "device_us": [e.duration_ns / 1e3 for e in evs],
            "host_us": [e.metadata.get("host_duration_ns", -1) / 1e3 for e in evs],
            "kernel_us": _kernel_durations_us(p),
            "synced": synced,
        }
    res["internal_errors"] = prof.internal_errors
    meshprof.disable()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=0, help="ranks (default: min(2, GPUs))")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="", help="write the raw results as JSON here")
    args = ap.parse_args()

    import torch

    from meshprof.launch.spawn import run_ranks

    if not torch.cuda.is_available():
        print("gpu_native_check: no CUDA device here; nothing to check", file=sys.stderr)
        return 2
    ws = args.ranks or min(2, torch.cuda.device_count())
    if ws > torch.cuda.device_count():
        print(f"gpu_native_check: {ws} ranks need {ws} GPUs", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name(0)} x{ws}, torch {torch.__version__}, "
          f"{platform.node()}")  # fmt: skip
    import meshprof.comm.native

    meshprof.comm.native.load()  # build once here (with CUDA when CUDA_HOME is set), not per rank
    results: dict[str, Any] = {}
    ok = True
    for mode in MODES:
        env = {"TORCH_NCCL_ENABLE_TIMING": "1" if mode == "native-timing" else "0"}
        r0 = run_ranks(_worker, ws, (mode, args.iters), backend="nccl", timeout=600, env=env)[0]
        results[mode] = r0
        want = "python" if mode == "python" else "native"
        if r0["backend"] != want:
            print(f"{mode}: recorded by the {r0['backend']} kernel, not {want}")
            ok = False
            continue
        for size, s in r0["sizes"].items():
            dev = statistics.median(s["device_us"]) if s["device_us"] else float("nan")
            host = statistics.median(s["host_us"]) if s["host_us"] else float("nan")
            ker = statistics.median(s["kernel_us"]) if s["kernel_us"] else float("nan")
            checks = {
                "once": s["n"] == args.iters and s["n_sync_pass"] == args.iters,
                "device-timed": all(h >= 0 for h in s["host_us"]),
                "no host sync": not s["synced"],
            }
            if ws > 1 or s["kernel_us"]:  # one rank: NCCL runs no kernel (nothing to compare)
                checks["vs kernel"] = 0.9 * ker <= dev <= ker + 1000.0
            failed = [k for k, v in checks.items() if not v]
            ok = ok and not failed and r0["internal_errors"] == 0
            print(
                f"{mode:14s} {int(size) >> 20:4d} MiB  device {dev:9.1f} us  kernel {ker:9.1f} us"
                f"  ratio {dev / ker:5.2f}  host {host:9.1f} us  "
                + ("ok" if not failed else "FAILED: " + ", ".join(failed))
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
