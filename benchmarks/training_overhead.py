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

    python benchmarks/training_overhead.py [--nproc 2] [--rounds 8] [--steps 20] [--model ddp|demo]
        [--captures N]
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
    "meshprof native",
    "meshprof, no capture code",
    "meshprof + idle capture agent",
    "torch.profiler",
    "torch.profiler schedule",
)


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


def _worker(
    rank: int, world: int, model: str, rounds: int, steps: int, captures: int = 0
) -> dict[str, Any]:
    import tempfile
    import types

    import torch

    import meshprof
    from meshprof.api import StepMonitor

    step = _ddp_step_factory(rank) if model == "ddp" else _demo_step_factory(rank, world)
    for _ in range(5):
        step(None)
    from meshprof.session.capture_agent import CaptureAgent

    times: dict[str, Any] = {v: [] for v in VARIANTS}
    mon = StepMonitor({"dp": world} if model == "ddp" else {"dp": world // 2, "pp": 2})
    box = [tempfile.mkdtemp(prefix="meshprof-capture-bench-") if rank == 0 else ""]
    torch.distributed.broadcast_object_list(box)
    run_dir = box[0]
    host = _Host(mon, rank)
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for variant in order:
            agent = None
            if variant.startswith("meshprof"):
                # installing the hooks is a one-time cost, not timed
                meshprof.enable(meshprof.ProfilerConfig(native=variant == "meshprof native"))
            if variant == "meshprof, no capture code":
                mon._open = types.MethodType(_open_without_capture_hook, mon)  # type: ignore[method-assign]
            if variant == "meshprof + idle capture agent":
                agent = CaptureAgent(run_dir, host).start()
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
            if agent is not None:
                agent.stop()
            if "_open" in vars(mon):
                del mon._open
            if variant.startswith("meshprof"):
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
            if model == "ddp":
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
    ap.add_argument("--model", choices=("ddp", "demo"), default="ddp")
    ap.add_argument("--captures", type=int, default=0, help="captures of 3 steps to take after")
    args = ap.parse_args()
    import meshprof.comm.native

    meshprof.comm.native.load()  # build the native recorder once, before the ranks start
    from meshprof.launch.spawn import run_ranks

    res = run_ranks(
        _worker, args.nproc, args=(args.model, args.rounds, args.steps, args.captures), timeout=1800
    )
    t = res[0]
    print(f"model={args.model} nproc={args.nproc} rounds={args.rounds} steps/round={args.steps}")
    print(f"{'variant':<30}{'step ms (median)':>14}{'steps/s':>10}{'overhead vs plain':>20}")
    for v in VARIANTS:
        ratios = [a / b for a, b in zip(t[v], t["plain"], strict=True)]
        med = statistics.median(t[v])
        print(
            f"{v:<30}{med * 1e3:>14.2f}{1 / med:>10.1f}{(statistics.median(ratios) - 1) * 100:>19.2f}%"
        )
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
