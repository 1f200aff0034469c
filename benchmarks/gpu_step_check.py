"""GPU proof of the step monitor, ``@performance_monitor`` and a triggered capture on CUDA, with
a small GPT (benchmarks/gpt_model.py) under DDP on one GPU (NCCL, world size 1).

    python benchmarks/gpu_step_check.py --out DIR [--steps 14]

Truths computed without meshprof:
  * step time: CUDA events around each step of the same loop before meshprof is on (median);
  * FLOPs per step: the analytic count (gpt_model.GPTConfig.flops_per_step) and torch's
    FlopCounterMode on one step;
  * peak memory: ``torch.cuda.max_memory_allocated`` over the same steps, reset before them;
  * the Kineto trace: written to DIR (trace.json.gz) with meshprof's breakdown of it
    (kineto.json) so that Holistic Trace Analysis can be run on the same file elsewhere
    (tests/test_kineto_gpu.py does, on the copy kept in tests/data).

Checks (exit status 1 when one fails): meshprof's FLOPs within 3 % of the analytic count, its
median step within 10 % of the CUDA-event median, MFU within 10 % of analytic FLOPs / (event
time x the card's datasheet peak), peak memory within 10 % of the allocator's and reported as
"cuda", DDP's all_reduces recorded device-timed, the trace holding GPU kernels and meshprof's
breakdown seeing them, a capture asked with CUDA activities done with kernels in its trace.
Also prints what one memory sample costs (µs). Nothing here is a unit test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpt_model


class _Host:
    """What the capture agent needs of a recording session."""

    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor

    def rank(self) -> int:
        return 0


def _within(a: float, b: float, tol: float) -> bool:
    return b != 0 and abs(a - b) <= tol * abs(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=14)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    import meshprof
    from meshprof.api import StepMonitor
    from meshprof.launch.spawn import free_port

    if not torch.cuda.is_available():
        print("gpu_step_check: no CUDA device here", file=sys.stderr)
        return 2
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    name = torch.cuda.get_device_name(0)
    print(f"# {name}, torch {torch.__version__}")
    cfg = gpt_model.GPTConfig()
    model, train_step = gpt_model.ddp_train_step(cfg, torch.device("cuda", 0))

    checks: dict[str, tuple[bool, str]] = {}
    res: dict[str, Any] = {"device": name, "torch": torch.__version__}

    # -- truth, meshprof off ------------------------------------------------------------------
    for _ in range(5):
        train_step().item()
    with FlopCounterMode(display=False) as fc:
        train_step().item()
    torch_flops = int(fc.get_total_flops())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    ev_ms = []
    for _ in range(args.steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        train_step().item()
        b.record()
        b.synchronize()
        ev_ms.append(a.elapsed_time(b))
    truth_peak = int(torch.cuda.max_memory_allocated())
    truth_step_ns = statistics.median(ev_ms) * 1e6
    analytic = cfg.flops_per_step()
    from meshprof.monitor.flop_counter import detect_peak_tflops

    peak_tf = detect_peak_tflops()
    res |= {"event_step_ms": ev_ms, "torch_flops": torch_flops, "analytic_flops": analytic}
    res |= {"truth_peak_bytes": truth_peak, "peak_tflops": peak_tf}

    # -- @performance_monitor -----------------------------------------------------------------
    perf = out / "perf"
    mon = meshprof.performance_monitor(
        model,
        out_dir=perf,
        wait=3,
        warmup=1,
        active=3,
        repeat=1,
        flop_counter_step=2,
        tokens_per_step=cfg.tokens,
        tensorboard=False,
        print_fn=lambda s: print("  perfmon:", s),
    )

    @mon
    def step() -> None:
        train_step().item()

    torch.cuda.synchronize()
    for _ in range(args.steps):
        step()
    mon.close()
    sm = mon.mon  # type: ignore[union-attr]
    an = StepMonitor.analysis(sm)
    res["analysis"] = an.to_dict()
    fl = an.flops
    mem = an.memory
    print(f"  meshprof: steps {an.steps}, p50 {an.step_time.p50_ns / 1e6:.2f} ms; "
          f"flops {fl.flops_per_step if fl else None}; mfu {fl.mfu if fl else None}; "
          f"memory {mem}")  # fmt: skip
    checks["flops vs analytic (3%)"] = (
        fl is not None and _within(fl.flops_per_step, analytic, 0.03),
        f"{fl.flops_per_step if fl else None} vs {analytic} (FlopCounterMode {torch_flops})",
    )
    checks["step vs CUDA events (10%)"] = (
        _within(an.step_time.p50_ns, truth_step_ns, 0.10),
        f"{an.step_time.p50_ns / 1e6:.3f} ms vs {truth_step_ns / 1e6:.3f} ms",
    )
    truth_mfu = analytic / (truth_step_ns / 1e9) / (peak_tf * 1e12) if peak_tf else None
    checks["mfu vs analytic/events/peak (10%)"] = (
        fl is not None and fl.mfu is not None and truth_mfu is not None
        and _within(fl.mfu, truth_mfu, 0.10),
        f"{fl.mfu if fl else None} vs {truth_mfu} (peak {peak_tf} TFLOP/s for {name!r})",
    )  # fmt: skip
    checks["peak memory vs allocator (10%)"] = (
        mem is not None and mem.kind == "cuda" and _within(mem.peak_bytes, truth_peak, 0.10),
        f"{mem.kind if mem else None} {mem.peak_bytes if mem else None} vs {truth_peak}; "
        f"capacity {mem.capacity_bytes if mem else None} vs "
        f"{torch.cuda.get_device_properties(0).total_memory}",
    )
    prof = meshprof.get_profiler()
    evs = [e for e in (prof.events() if prof else []) if e.op == "all_reduce"]
    timed = [e for e in evs if e.metadata.get("host_duration_ns", -1) >= 0]
    checks["DDP all_reduces device-timed"] = (
        bool(evs) and len(timed) == len(evs),
        f"{len(evs)} all_reduce, {len(timed)} with host_duration_ns; kernel "
        f"{prof.backend_name if prof else None}",
    )
    res["allreduce_device_us"] = [e.duration_ns / 1e3 for e in evs[-20:]]
    res["allreduce_host_us"] = [e.metadata.get("host_duration_ns", -1) / 1e3 for e in evs[-20:]]

    # -- the Kineto trace -----------------------------------------------------------------------
    from meshprof.analyze.traces.kineto import find_traces, kineto_report
    from meshprof.records.codec import dataclass_to_json

    traces = [t for t in find_traces(perf) if t.name.startswith("trace_rank")]
    kernels = 0
    if traces:
        t = traces[0]
        doc = json.loads(
            gzip.decompress(t.read_bytes()) if t.name.endswith(".gz") else t.read_bytes()
        )
        kernels = sum(1 for e in doc.get("traceEvents", []) if e.get("cat") == "kernel")
        shutil.copy(t, out / ("trace.json.gz" if t.name.endswith(".gz") else "trace.json"))
        rep = kineto_report([t])
        (out / "kineto.json").write_text(json.dumps(dataclass_to_json(rep), indent=1))
        gpu = rep.ranks[0].gpu if rep.ranks else None
        checks["trace has GPU kernels, breakdown sees them"] = (
            kernels > 0 and gpu is not None,
            f"{t.name}: {kernels} kernels, {t.stat().st_size} B; gpu {gpu}",
        )
    else:
        checks["trace has GPU kernels, breakdown sees them"] = (False, f"no trace in {perf}")

    # -- a capture with CUDA activities ---------------------------------------------------------
    from meshprof.records.captures import CaptureRequest
    from meshprof.rundir.captures import capture_dir, read_statuses
    from meshprof.rundir.requests import write_request
    from meshprof.session.capture_agent import CaptureAgent

    meshprof.reset()
    meshprof.enable()
    smon = StepMonitor()
    run_dir = out / "capture_run"
    run_dir.mkdir(exist_ok=True)
    agent = CaptureAgent(run_dir, _Host(smon), poll_s=0.05).start()
    req = CaptureRequest(
        id="gpu1", ranks=(0,), steps=3, requested_ns=time.time_ns(), timeout_s=60.0,
        activities=("cpu", "cuda"),
    )  # fmt: skip
    write_request(run_dir, req)
    st = None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with smon.step(tokens=cfg.tokens):
            train_step().item()
        st = read_statuses(run_dir, req.id).get(0)
        if st is not None and st.state.final:
            break
    agent.stop()
    ck = 0
    if st is not None and st.trace:
        tdoc = json.loads(gzip.decompress((capture_dir(run_dir, req.id) / st.trace).read_bytes()))
        ck = sum(1 for e in tdoc.get("traceEvents", []) if e.get("cat") == "kernel")
    checks["capture with CUDA activities"] = (
        st is not None and st.state.name == "DONE" and ck > 0 and "cuda" in st.activities,
        f"{st.state.name if st else None} {st.message if st else ''}; activities "
        f"{st.activities if st else None}; {ck} kernels; cost {st.cost if st else None}",
    )

    # -- what a memory sample costs -------------------------------------------------------------
    from meshprof.monitor.memory_sampler import sample_memory

    for _ in range(50):
        sample_memory(0, 0)
    per = []
    for _ in range(20):
        t0 = time.perf_counter_ns()
        for _ in range(100):
            sample_memory(0, 0)
        per.append((time.perf_counter_ns() - t0) / 100 / 1e3)
    res["sample_memory_us"] = statistics.median(per)
    res["checks"] = {k: [ok, why] for k, (ok, why) in checks.items()}
    (out / "step_check.json").write_text(json.dumps(res, indent=1, default=str))
    meshprof.reset()
    dist.destroy_process_group()
    print(f"  one memory sample: {res['sample_memory_us']:.1f} us (median)")
    for k, (ok, why) in checks.items():
        print(f"{'ok    ' if ok else 'FAILED'} {k}: {why}")
    return 0 if all(ok for ok, _ in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
