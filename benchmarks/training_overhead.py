"""Training overhead: steps/s of a plain DDP job (and the demo's 3D-parallel model when
available) uninstrumented vs meshprof (recorder + step monitor) vs torch.profiler always on vs
torch.profiler on a schedule; and the captures' part (``meshprof capture``): meshprof without
the capture code (the step monitor's boundary as it was before it: no hook check) vs meshprof
with an idle capture agent (its thread looking for requests twice a second, the hook check at
every step boundary).

Ratios are measured in one run: every round runs each variant for the same number of steps, in
rotating order (A/B/C/D, B/C/D/A, ...), and the figure is the median over rounds of each
variant's step time relative to the uninstrumented one in the same round.

``--captures N`` then takes N captures of 3 steps on both ranks while the job steps, and prints
what each cost (the ranks' statuses: torch.profiler's start and stop at the boundaries, the step
annotations, writing the trace off the training thread, the traced steps against the steps
before), and the steps while the first capture's agent imports what torch.profiler needs.

    python benchmarks/training_overhead.py [--nproc 2] [--rounds 8] [--steps 20]
        [--model ddp|demo|gpt] [--device cpu|cuda] [--captures N]

``--device cuda`` runs NCCL with one GPU per rank (each timed round ends with a device
synchronize); ``--model gpt`` is benchmarks/gpt_model.py's small GPT under DDP (cuda only).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any

VARIANTS = (
    "plain",
    "meshprof",
    "meshprof python",
    "meshprof native",
    "meshprof, no capture code",
    "meshprof + idle capture agent",
    "torch.profiler",
    "torch.profiler schedule",
)
#: On CUDA: the capture variants left out, the parts of meshprof taken apart instead.
CUDA_VARIANTS = (
    "plain",
    "meshprof",
    "meshprof python",
    "meshprof python, no device timing",
    "meshprof native",
    "recorder only",
    "step monitor only",
    "torch.profiler",
    "torch.profiler schedule",
)
#: Recorder settings per variant (absent: no recorder). "meshprof" is the default (the native
#: kernel where it can run, meshprof.comm.selection); the step monitor times every variant
#: whose name starts with "meshprof" and "step monitor only".
CONFIGS: dict[str, dict[str, Any]] = {
    "meshprof": {},
    "meshprof python": {"native": False},
    "meshprof python, no device timing": {"native": False, "device_timing": False},
    "meshprof native": {"native": True},
    "meshprof, no capture code": {},
    "meshprof + idle capture agent": {},
    "recorder only": {},
}


def _open_without_capture_hook(self: Any, span: Any) -> None:
    """``StepMonitor._open`` as it was before captures (no boundary hook check)."""
    from meshprof.monitor.step_monitor import _STEP

    stack = self._stack()
    if span.kind == _STEP:
        if stack and stack[0] is self._implicit and span is not self._implicit:
            self._close(self._implicit, False)
            self._implicit = None
            stack = self._stack()
        span.step = self._step_no
        prof = self._prof()
        if prof is not None:
            prof.step = span.step
    else:
        span.step = stack[0].step if stack else -1
    span.depth = len(stack)
    stack.append(span)
    span.cpu0 = time.thread_time_ns()
    span.t0 = time.perf_counter_ns()


class _Host:
    """What the capture agent needs of a recording session."""

    def __init__(self, monitor: Any, rank: int) -> None:
        self.monitor = monitor
        self._rank = rank

    def rank(self) -> int:
        return self._rank


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


def _gpt_step_factory(rank: int) -> Any:
    """One step of a small GPT (benchmarks/gpt_model.py) under DDP on this rank's GPU, ending in
    ``loss.item()`` as training loops that log the loss do (the host waits for the step)."""
    import sys
    from pathlib import Path

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpt_model

    cfg = gpt_model.GPTConfig()
    dev = torch.device("cuda", torch.cuda.current_device())
    model = DDP(gpt_model.build(cfg, dev), device_ids=[dev.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x, y = gpt_model.batch(cfg, dev)

    def step(mon: Any) -> None:
        with mon.phase("forward") if mon else contextlib.nullcontext():
            loss = gpt_model.loss_fn(model, x, y)
        with mon.phase("backward") if mon else contextlib.nullcontext():
            loss.backward()
        with mon.phase("optimizer") if mon else contextlib.nullcontext():
            opt.step()
            opt.zero_grad(set_to_none=True)
        loss.item()

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
        device=(
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available() and torch.distributed.get_backend() == "nccl"
            else torch.device("cpu")
        ),
        lr=1e-3,
    )

    def step(mon: Any) -> None:
        train(job, 1, seed=0, monitor=mon)

    return step


def _worker(
    rank: int, world: int, model: str, rounds: int, steps: int, captures: int = 0
) -> dict[str, Any]:
    import tempfile
    import types

    import torch

    import meshprof
    from meshprof.api import StepMonitor

    cuda = torch.distributed.get_backend() == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    if model == "gpt":
        step = _gpt_step_factory(rank)
    elif model == "ddp":
        step = _ddp_step_factory(rank)
    else:
        step = _demo_step_factory(rank, world)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(5):
        step(None)
    from meshprof.session.capture_agent import CaptureAgent

    variants = CUDA_VARIANTS if cuda else VARIANTS
    times: dict[str, Any] = {v: [] for v in variants}
    mon = StepMonitor({"dp": world // 2, "pp": 2} if model == "demo" else {"dp": world})
    box = [tempfile.mkdtemp(prefix="meshprof-capture-bench-") if rank == 0 else ""]
    torch.distributed.broadcast_object_list(box)
    run_dir = box[0]
    host = _Host(mon, rank)
    for r in range(rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for variant in order:
            agent = None
            if variant in CONFIGS:
                # installing the hooks is a one-time cost, not timed
                meshprof.enable(meshprof.ProfilerConfig(**CONFIGS[variant]))
            if variant == "meshprof, no capture code":
                mon._open = types.MethodType(_open_without_capture_hook, mon)  # type: ignore[method-assign]
            if variant == "meshprof + idle capture agent":
                agent = CaptureAgent(run_dir, host).start()
            sync()
            torch.distributed.barrier()
            t0 = time.perf_counter()
            if variant in ("plain", "recorder only"):
                for _ in range(steps):
                    step(None)
            elif variant.startswith("meshprof") or variant == "step monitor only":
                for _ in range(steps):
                    if model != "demo":
                        with mon.step(tokens=64):
                            step(mon)
                    else:
                        step(mon)  # the demo's loop opens the step itself
            elif variant == "torch.profiler":
                with torch.profiler.profile(activities=acts):
                    for _ in range(steps):
                        step(None)
            else:
                sched = torch.profiler.schedule(wait=steps - 4, warmup=1, active=2, repeat=1)
                with torch.profiler.profile(activities=acts, schedule=sched) as p:
                    for _ in range(steps):
                        step(None)
                        p.step()
            sync()
            torch.distributed.barrier()
            times[variant].append((time.perf_counter() - t0) / steps)
            if agent is not None:
                agent.stop()
            if "_open" in vars(mon):
                del mon._open
            if variant in CONFIGS:
                meshprof.reset()
    if captures:
        times["captures"] = _capture_costs(rank, world, mon, host, run_dir, step, model, captures)
    return times


def _capture_costs(
    rank: int, world: int, mon: Any, host: Any, run_dir: str, step: Any, model: str, n: int
) -> dict[str, Any]:
    """Take ``n`` captures of 3 steps on every rank while the job steps; what each cost."""
    import torch

    import meshprof
    from meshprof.records.captures import CaptureRequest
    from meshprof.rundir.captures import read_statuses
    from meshprof.rundir.requests import write_request
    from meshprof.session.capture_agent import CaptureAgent

    meshprof.enable()
    agent = CaptureAgent(run_dir, host).start()
    ids = []
    first_window: list[int] = []
    for i in range(n):
        req = CaptureRequest(
            id=f"bench{i}",
            ranks=tuple(range(world)),
            steps=3,
            requested_ns=time.time_ns(),
            timeout_s=60.0,
        )
        ids.append(req.id)
        torch.distributed.barrier()
        if rank == 0:
            write_request(run_dir, req)
        t_req = time.time_ns()
        done = torch.zeros(1)
        while done.item() < world:
            if model != "demo":
                with mon.step(tokens=64):
                    step(mon)
            else:
                step(mon)
            st = read_statuses(run_dir, req.id).get(rank)
            done = torch.tensor([1.0 if st is not None and st.state.final else 0.0])
            torch.distributed.all_reduce(done)
        if i == 0:  # steps while the agent imported what torch.profiler needs (first capture)
            spans = [r for r in mon.span_rows if r[0] == 0 and r[5] >= t_req]
            st = read_statuses(run_dir, req.id)[rank]
            first_window = [
                int(r[6]) for r in spans if st.steps and r[5] + r[6] <= st.steps[0].start_ns
            ]
    agent.stop()
    meshprof.reset()
    before = [int(r[6]) for r in mon.span_rows if r[0] == 0]
    return {
        "statuses": [read_statuses(run_dir, i)[rank].to_dict() for i in ids],
        "first_arming_steps_ns": first_window,
        "all_steps_ns": before,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", choices=("ddp", "demo", "gpt"), default="ddp")
    ap.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL, one GPU per rank"
    )
    ap.add_argument("--captures", type=int, default=0, help="captures of 3 steps to take after")
    args = ap.parse_args()
    import meshprof.comm.native

    meshprof.comm.native.load()  # build the native recorder once, before the ranks start
    from meshprof.launch.spawn import run_ranks

    if args.model == "gpt" and args.device != "cuda":
        ap.error("--model gpt needs --device cuda")
    res = run_ranks(
        _worker,
        args.nproc,
        args=(args.model, args.rounds, args.steps, args.captures),
        timeout=1800,
        backend="nccl" if args.device == "cuda" else "gloo",
    )
    t = res[0]
    print(
        f"model={args.model} device={args.device} nproc={args.nproc} rounds={args.rounds} "
        f"steps/round={args.steps}"
    )
    print(f"{'variant':<36}{'step ms (median)':>14}{'steps/s':>10}{'overhead vs plain':>20}")
    for v in [k for k in t if k in VARIANTS + CUDA_VARIANTS]:
        ratios = [a / b for a, b in zip(t[v], t["plain"], strict=True)]
        med = statistics.median(t[v])
        print(
            f"{v:<36}{med * 1e3:>14.2f}{1 / med:>10.1f}{(statistics.median(ratios) - 1) * 100:>19.2f}%"
        )
    if "meshprof + idle capture agent" not in t:
        return
    pre, idle = t["meshprof, no capture code"], t["meshprof + idle capture agent"]
    ratios = sorted(a / b for a, b in zip(idle, pre, strict=True))
    print(
        f"idle capture agent vs no capture code: median ratio {statistics.median(ratios):.4f} "
        f"(rounds: {min(ratios):.4f} .. {max(ratios):.4f})"
    )
    if args.captures:
        _print_capture_costs(res)


def _print_capture_costs(res: list[dict[str, Any]]) -> None:
    def ms(ns: float) -> str:
        return f"{ns / 1e6:.2f} ms"

    print(f"\ncaptures of 3 steps, per rank and capture (median over {len(res)} rank(s)):")
    print(
        f"{'capture':<9}{'start':>10}{'stop':>10}{'annot.':>10}{'write*':>10}"
        f"{'step before':>13}{'traced step':>13}{'trace KiB':>11}"
    )
    n = len(res[0]["captures"]["statuses"])
    for i in range(n):
        sts = [res[r]["captures"]["statuses"][i] for r in range(len(res))]
        c = [s["cost"] for s in sts]

        def med(key: str, c: list[dict[str, Any]] = c) -> float:
            return statistics.median(x[key] for x in c)

        kib = statistics.median(s["trace_bytes"] for s in sts) / 1024
        print(
            f"{i:<9}{ms(med('start_ns')):>10}{ms(med('stop_ns')):>10}{ms(med('boundary_ns')):>10}"
            f"{ms(med('write_ns')):>10}{ms(med('step_ns_before')):>13}"
            f"{ms(med('step_ns_during')):>13}{kib:>11.1f}"
        )
    print("* write: off the training thread (the capture agent's)")
    for r in range(len(res)):
        w = res[r]["captures"]["first_arming_steps_ns"]
        allsteps = res[r]["captures"]["all_steps_ns"]
        if w and allsteps:
            print(
                f"rank {r}: {len(w)} steps while the first capture armed: median {ms(statistics.median(w))} "
                f"(all steps of the run: {ms(statistics.median(allsteps))})"
            )


if __name__ == "__main__":
    main()
