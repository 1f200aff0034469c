"""Text that ``@performance_monitor`` shows people or writes next to its JSON files: the
settings at start, the FLOPs per module, the communication log table, the trace message.
Formatting only: every number comes computed from the perfmon parts (FLOPs as counts, TFLOP/s,
MFU as a fraction 0..1, bytes, durations in ns).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from meshprof.render.format import fmt_bytes, fmt_ns

if TYPE_CHECKING:
    from meshprof.config import PerfmonConfig
    from meshprof.records.perfmon import CommLog, FlopsReport


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _at_step(label: str, step: int | None) -> str:
    return f"  {label}: step {step}" if step is not None else f"  {label}: off"


def describe_config(c: PerfmonConfig, world_size: int) -> str:
    """What the monitor will do, printed by rank 0 when the first step starts."""
    windows = ", ".join(f"{a}-{b}" for a, b in c.trace_windows())
    again = " (then every cycle)" if c.repeat == 0 else ""
    lines = [
        f"meshprof performance_monitor: {world_size} rank(s), output in {c.out_path}",
        f"  torch.profiler schedule: wait={c.wait} warmup={c.warmup} active={c.active} repeat={c.repeat} -> traces of steps {windows}{again}"
        if c.profiler
        else "  torch.profiler: off",
        _at_step("FLOP counter", c.flop_counter_step),
        _at_step("communication log", c.comm_logger_step),
        _at_step("memory snapshot", c.memory_snapshot_step),
        f"  nsight (NVTX): {_on(c.nsight)}   tensorboard: {_on(c.tensorboard)}   wandb: {_on(c.wandb)}",
        f"  record_shapes={c.record_shapes} profile_memory={c.profile_memory} with_stack={c.with_stack}",
    ]
    return "\n".join(lines)


def flops_summary(r: FlopsReport) -> str:
    """FLOPs per module (GFLOP, largest first) and the step's TFLOP/s and MFU."""
    rows = sorted(((m, d.total) for m, d in r.modules.items()), key=lambda x: -x[1])
    width = max((len(m) for m, _ in rows), default=6)
    text = "\n".join(f"  {m:<{width}}  {n / 1e9:12.6f} GFLOP" for m, n in rows)
    mfu_txt = f"{r.mfu:.1%}" if r.mfu is not None else "n/a (set MESHPROF_PEAK_TFLOPS)"
    return (
        f"meshprof: FLOPs per module (step {r.step}):\n{text}\n"
        f"meshprof: step {r.step}: {r.total_flops / 1e9:.6f} GFLOP, {r.achieved_tflops:.4f} TFLOP/s achieved, MFU {mfu_txt} (this step ran under the FLOP counter, so it was slower than usual)"
    )


def comm_log_text(log: CommLog) -> str:
    """The ``comm_debug_step{N}.txt`` file: one line per collective, counts per module and
    phase, and CommDebugMode's own table of DTensor collectives."""
    lines = [
        f"meshprof communication log: rank {log.rank}, step {log.step}, {len(log.rows)} collective(s)",
        "",
        f"{'#':>4}  {'op':<16} {'group':<14} {'bytes':>10} {'time':>10}  {'phase':<9} module",
    ]
    for i, r in enumerate(log.rows):
        e = r.event
        lines.append(
            f"{i:>4}  {e.op:<16} {e.group_desc or e.group_name:<14} {fmt_bytes(max(e.in_bytes, e.out_bytes)):>10} {fmt_ns(e.duration_ns):>10}  {r.phase:<9} {r.module or '-'}"
        )
    lines += ["", "per module and phase:"]
    lines += [f"  {k}: {v}" for k, v in sorted(log.by_module.items())]
    lines += [
        "",
        "DTensor CommDebugMode (DTensor collectives per module, forward/backward):",
        log.dtensor_table.strip() or "(no DTensor collectives in this step)",
    ]
    return "\n".join(lines) + "\n"


def trace_message(step: int, path: Path, cuda: bool, table: str) -> str:
    """Printed when a trace window is written; ``table`` is torch.profiler's own op table."""
    basis = "device (CUDA)" if cuda else "CPU"
    return (
        f"meshprof: trace of the window ending at step {step} -> {path}\n"
        f"meshprof: ten most expensive ops by self {basis} time:\n{table}"
    )
