"""Where the recorder's time goes on a GPU training step: the small GPT (gpt_model.py) under DDP
on one GPU (NCCL, world size 1), per recorder kernel (python, native): the step time against
no recorder in alternating rounds, and the Python functions the training thread spent most in
(cProfile, python kernel). Also what one memory sample of the step monitor costs. (Its first
run, 2026-11-26 on an H200, found the Python kernel's CUDA future callbacks all running on
NCCL's thread and the step 20 % slower with them: they are gone, see
``meshprof.comm.completion.Completion.watch``.) Diagnosis, not a test:

    python benchmarks/gpu_kernel_probe.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpt_model


def main() -> int:
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.launch.spawn import free_port

    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    _model, train_step = gpt_model.ddp_train_step(gpt_model.GPTConfig(), torch.device("cuda", 0))

    def step() -> None:
        train_step().item()

    modes: dict[str, dict[str, Any] | None] = {
        "none": None,
        "python": {"native": False},
        "python, no device timing": {"native": False, "device_timing": False},
        "native": {"native": True},
    }
    for _ in range(5):
        step()
    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(6):
        for m, c in list(modes.items())[r % 4 :] + list(modes.items())[: r % 4]:
            meshprof.reset()
            if c is not None:
                meshprof.enable(meshprof.ProfilerConfig(**c))
            step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            times[m].append((time.perf_counter() - t0) / 10 * 1e3)
    meshprof.reset()
    for m, v in times.items():
        print(
            f"probe {m:<26} step {statistics.median(v):7.2f} ms (rounds {min(v):.2f}..{max(v):.2f})"
        )
    meshprof.enable(meshprof.ProfilerConfig(native=False))
    step()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10):
        step()
    pr.disable()
    meshprof.reset()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(18)
    print("\n".join("probe " + line for line in buf.getvalue().splitlines() if line.strip()))

    from meshprof.monitor.memory_sampler import sample_memory

    def old() -> None:
        torch.cuda.memory_allocated(0)
        torch.cuda.memory_reserved(0)
        torch.cuda.max_memory_allocated(0)

    for name, fn in (("new sample_memory", lambda: sample_memory(0, 0)), ("three stat calls", old)):
        for _ in range(20):
            fn()
        per = []
        for _ in range(10):
            t0 = time.perf_counter_ns()
            for _ in range(50):
                fn()
            per.append((time.perf_counter_ns() - t0) / 50 / 1e3)
        print(f"probe {name}: {statistics.median(per):.1f} us")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
