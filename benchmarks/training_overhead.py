"""Training overhead: steps/s of a plain DDP job (and the demo's 3D-parallel model when
available) uninstrumented vs meshprof (recorder + step monitor) vs torch.profiler always on vs
torch.profiler on a schedule.

Ratios are measured in one run: every round runs each variant for the same number of steps, in
rotating order (A/B/C/D, B/C/D/A, ...), and the figure is the median over rounds of each
variant's step time relative to the uninstrumented one in the same round.

    python benchmarks/training_overhead.py [--nproc 2] [--rounds 8] [--steps 20] [--model ddp|demo]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any

VARIANTS = ("plain", "meshprof", "meshprof native", "torch.profiler", "torch.profiler schedule")


def _ddp_step_factory(rank: int) -> Any:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(
            torch.nn.Linear(512, 1024),
            torch.nn.GELU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.GELU(),
            torch.nn.Linear(1024, 512),
        ),
        bucket_cap_mb=1,
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512)

    def step(mon: Any) -> None:
        with mon.phase("forward") if mon else contextlib.nullcontext():
            loss = model(x).square().mean()
        with mon.phase("backward") if mon else contextlib.nullcontext():
            loss.backward()
        with mon.phase("optimizer") if mon else contextlib.nullcontext():
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def _demo_step_factory(rank: int, world: int) -> Any:
    """One optimizer step of the demo's transformer, dp × pp over the ranks (pp=2 when even)."""
    import torch

    from meshprof.demo.build import build_job
    from meshprof.demo.train import train
    from meshprof.parallel.model_config import ModelConfig
    from meshprof.parallel.parallel_config import ParallelConfig

    pp = 2 if world % 2 == 0 else 1
    job = build_job(
        ParallelConfig(dp=world // pp, pp=pp),
        ModelConfig(),
        seed=0,
        dtype=torch.float32,
        device=torch.device("cpu"),
        lr=1e-3,
    )

    def step(mon: Any) -> None:
        train(job, 1, seed=0, monitor=mon)

    return step


def _worker(rank: int, world: int, model: str, rounds: int, steps: int) -> dict[str, list[float]]:
    import torch

    import meshprof
    from meshprof.api import StepMonitor

    step = _ddp_step_factory(rank) if model == "ddp" else _demo_step_factory(rank, world)
    for _ in range(5):
        step(None)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    mon = StepMonitor({"dp": world} if model == "ddp" else {"dp": world // 2, "pp": 2})
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for variant in order:
            if variant.startswith("meshprof"):
                # installing the hooks is a one-time cost, not timed
                meshprof.enable(meshprof.ProfilerConfig(native=variant == "meshprof native"))
            torch.distributed.barrier()
            t0 = time.perf_counter()
            if variant == "plain":
                for _ in range(steps):
                    step(None)
            elif variant.startswith("meshprof"):
                for _ in range(steps):
                    if model == "ddp":
                        with mon.step(tokens=64):
                            step(mon)
                    else:
                        step(mon)  # the demo's loop opens the step itself
            elif variant == "torch.profiler":
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                    for _ in range(steps):
                        step(None)
            else:
                sched = torch.profiler.schedule(wait=steps - 4, warmup=1, active=2, repeat=1)
                with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched
                ) as p:
                    for _ in range(steps):
                        step(None)
                        p.step()
            torch.distributed.barrier()
            times[variant].append((time.perf_counter() - t0) / steps)
            if variant.startswith("meshprof"):
                meshprof.reset()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", choices=("ddp", "demo"), default="ddp")
    args = ap.parse_args()
    import meshprof.comm.native

    meshprof.comm.native.load()  # build the native recorder once, before the ranks start
    from meshprof.launch.spawn import run_ranks

    res = run_ranks(_worker, args.nproc, args=(args.model, args.rounds, args.steps), timeout=1800)
    t = res[0]
    print(f"model={args.model} nproc={args.nproc} rounds={args.rounds} steps/round={args.steps}")
    print(f"{'variant':<26}{'step ms (median)':>18}{'steps/s':>10}{'overhead vs plain':>20}")
    for v in VARIANTS:
        ratios = [a / b for a, b in zip(t[v], t["plain"], strict=True)]
        med = statistics.median(t[v])
        print(
            f"{v:<26}{med * 1e3:>18.2f}{1 / med:>10.1f}{(statistics.median(ratios) - 1) * 100:>19.2f}%"
        )


if __name__ == "__main__":
    main()
