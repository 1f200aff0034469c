"""``@performance_monitor``: one decorator on a training step for everything at once.

    monitor = meshprof.performance_monitor(model, out_dir="runs/x", wait=1, warmup=1, active=2,
                                           flop_counter_step=3, comm_logger_step=4)

    @monitor
    def train_step(batch): ...

Every call of the step is one step of the :class:`~meshprof.monitor.StepMonitor` (steps are
numbered from the monitor's current step, 0 for a fresh one); the collective recorder is enabled.
On the way it runs torch.profiler on its schedule (``trace_rank{r}_step{s}.json.gz``), counts
FLOPs on ``flop_counter_step`` (``flops_step{N}.json``), logs every collective of
``comm_logger_step`` with its module and forward/backward phase (``comm_step{M}.json``,
``comm_debug_step{M}.txt``), dumps a CUDA memory snapshot on ``memory_snapshot_step``, writes
NVTX ranges, TensorBoard and W&B scalars, and this rank's ``rankNNNNN.npz`` (so ``meshprof report
out_dir`` works). Rank r > 0 writes its per-step files with a ``_rank{r}`` suffix.

Nothing here raises into the training step: a failing part warns once and is switched off. The
step's return value and exceptions pass through unchanged. ``enabled=False`` returns the step
function itself.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

F = TypeVar("F", bound=Callable[..., Any])
#: Longest wait (seconds) for the communication-log step's collectives still in flight.
COMM_SETTLE_S = 2.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # CommDebugMode colors its table for terminals


def _rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    r, w = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    return (int(r) if r.isdigit() else 0), (int(w) if w.isdigit() else 1)


class ModuleTimeline:
    """Forward intervals and backward start times of a model's modules during one step, to
    attribute collectives to the module and phase that issued them (by their start time).

    Forward: pre/post forward hooks give [start, end] per call. Backward: a pre-hook on the
    autograd node that produced a module's output fires when the backward of that module begins;
    a callback queued on the autograd engine marks the end of the backward pass. No full
    backward hooks are used, so the model's autograd graph (in-place ops included) is unchanged.
    """

    def __init__(self, model: Any) -> None:
        self.forward: list[tuple[str, int, int]] = []
        """(module name, start_ns, end_ns) per forward call (wall clock)."""
        self.backward: list[tuple[str, int]] = []
        """(module name, start_ns) when each module's backward began."""
        self.backward_end_ns: int | None = None
        """When the backward pass ended (an autograd engine callback)."""
        self.errors = 0
        """Hook errors swallowed (attribution may be incomplete when > 0)."""
        self._open: dict[int, list[int]] = {}
        self._handles: list[Any] = []
        self._lock = threading.Lock()
        for name, mod in model.named_modules():
            label = name or type(model).__name__
            self._handles.append(mod.register_forward_pre_hook(functools.partial(self._pre, label)))
            self._handles.append(mod.register_forward_hook(functools.partial(self._post, label)))

    def _pre(self, name: str, mod: Any, args: Any) -> None:
        self._open.setdefault(id(mod), []).append(time.time_ns())

    def _post(self, name: str, mod: Any, args: Any, out: Any) -> None:
        try:
            t1 = time.time_ns()
            starts = self._open.get(id(mod))
            t0 = starts.pop() if starts else t1
            self.forward.append((name, t0, t1))
            import torch

            seq = out if isinstance(out, (tuple, list)) else [out]
            first = next(
                (o for o in seq if isinstance(o, torch.Tensor) and o.grad_fn is not None), None
            )
            node = first.grad_fn if first is not None else None
            if node is not None:
                node.register_prehook(functools.partial(self._bw_start, name))
        except Exception:
            self.errors += 1

    def _bw_start(self, name: str, grad_outputs: Any) -> None:
        try:
            with self._lock:
                first = not self.backward
                self.backward.append((name, time.time_ns()))
            if first:
                from torch.autograd import Variable

                Variable._execution_engine.queue_callback(self._bw_end)
        except Exception:
            self.errors += 1

    def _bw_end(self) -> None:
        self.backward_end_ns = time.time_ns()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def attribute(self, start_ns: int) -> tuple[str, str]:
        """(module, phase) of a collective issued at ``start_ns``: phase "forward", "backward"
        or "other"; module "" when none applies."""
        best: tuple[int, int, str] | None = None
        for name, t0, t1 in self.forward:
            if t0 <= start_ns <= t1:
                key = (t0, -(t1 - t0), name)
                if best is None or key[:2] > best[:2]:
                    best = key
        if best is not None:
            return best[2], "forward"
        bw = [b for b in self.backward if b[1] <= start_ns]
        end = self.backward_end_ns
        if bw and (end is None or start_ns <= end):
            latest = max(b[1] for b in bw)
            names = [n for n, t in bw if t == latest] or [bw[-1][0]]
            return max(names, key=lambda n: n.count(".")), "backward"
        return "", "other"


class _Off:
    """What ``performance_monitor(enabled=False)`` returns: decorating gives the function back."""

    enabled = False

    def __call__(self, fn: F) -> F:
        return fn

    def close(self) -> None:
        pass


class PerformanceMonitor:
    """See :func:`performance_monitor`."""

    enabled = True

    def __init__(
        self,
        model: Any = None,
        *,
        out_dir: str | os.PathLike[str] = "meshprof_out",
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        flop_counter_step: int | None = None,
        comm_logger_step: int | None = None,
        memory_snapshot_step: int | None = None,
        nsight: bool = False,
        tensorboard: bool = False,
        wandb: bool = False,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        profiler: bool = True,
        monitor: Any = None,
        tokens_per_step: int = 0,
        samples_per_step: int = 0,
        print_fn: Callable[[str], None] | None = None,
    ) -> None:
        for k, v in (("wait", wait), ("warmup", warmup), ("active", active), ("repeat", repeat)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"performance_monitor: {k} must be an integer >= 0, got {v!r}")
        if active < 1:
            raise ValueError(f"performance_monitor: active must be >= 1, got {active}")
        self.model = model
        self.out_dir = Path(out_dir)
        self.schedule = {"wait": wait, "warmup": warmup, "active": active, "repeat": repeat}
        self.flop_counter_step = flop_counter_step
        self.comm_logger_step = comm_logger_step
        self.memory_snapshot_step = memory_snapshot_step
        self.nsight = nsight
        self.use_tensorboard = tensorboard
        self.use_wandb = wandb
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.use_profiler = profiler
        self.tokens_per_step = tokens_per_step
        self.samples_per_step = samples_per_step
        self._print = print_fn or (lambda s: print(s, file=sys.stderr, flush=True))
        self._given_monitor = monitor
        self.mon: Any = None
        self.prof: Any = None
        self.rank, self.world_size = 0, 1
        self.started = False
        self.closed = False
        self.failures: dict[str, str] = {}
        """Parts switched off after an error: part -> message."""
        self.files: list[Path] = []
        """Files written so far."""
        self.flops_per_step: float | None = None
        self.last_step_ns: int = 0
        self._torch_prof: Any = None
        self._tb: Any = None
        self._wandb: Any = None
        self._writer: Any = None
        self._cuda = False
        self._cur_step = 0
        self._pending_comm: tuple[dict[str, Any], int] | None = None
        self._pending_scalars: tuple[int, int, int] | None = None
        self._lock = threading.Lock()

    # -- decorating -------------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            state = self._before()
            try:
                out = fn(*args, **kwargs)
            except BaseException:
                self._after(state, True)
                raise
            self._after(state, False)
            return out

        return wrapper  # type: ignore[return-value]

    # -- parts ------------------------------------------------------------------------------------
    def _fail(self, part: str, e: BaseException) -> None:
        if part not in self.failures:
            self.failures[part] = f"{type(e).__name__}: {e}"
            warnings.warn(
                f"meshprof performance_monitor: {part} switched off after an error: {type(e).__name__}: {e}",
                RuntimeWarning,
                stacklevel=4,
            )

    def _ok(self, part: str) -> bool:
        return part not in self.failures

    def _name(self, stem: str, ext: str) -> Path:
        return self.out_dir / (f"{stem}{ext}" if self.rank == 0 else f"{stem}_rank{self.rank}{ext}")

    def _start(self) -> None:
        import meshprof
        from meshprof.monitor import StepMonitor, get_monitor

        self.started = True
        self.rank, self.world_size = _rank_world()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prof = meshprof.enable()
        self.mon = self._given_monitor or get_monitor() or StepMonitor(rank=self.rank)
        try:
            import torch

            self._cuda = bool(torch.cuda.is_available())
        except Exception:
            self._cuda = False
        if self.rank == 0:
            self._print(self.describe())
            from meshprof.rundir import write_manifest

            write_manifest(
                self.out_dir,
                {
                    "world_size": self.world_size,
                    "source": "performance_monitor",
                    "config": self.config(),
                },
            )
        if self.use_profiler:
            try:
                self._start_profiler()
            except Exception as e:
                self._fail("profiler", e)
        if self.use_tensorboard and self.rank == 0:
            try:
                from meshprof.render.tensorboard import TensorBoardLogger

                self._tb = TensorBoardLogger(self.out_dir / "tensorboard")
            except Exception as e:
                self._fail("tensorboard", e)
        if self.use_wandb and self.rank == 0:
            try:
                from meshprof.render.wandb import WandbLogger

                self._wandb = WandbLogger(self.out_dir, config=self.config())
            except Exception as e:
                self._fail("wandb", e)
        if self.memory_snapshot_step is not None and not self._cuda and self.rank == 0:
            self._print(
                f"meshprof: memory snapshot (step {self.memory_snapshot_step}) needs CUDA; this run has no GPU, so no snapshot will be written"
            )
        try:
            from meshprof.session import RankWriter

            self._writer = RankWriter(
                self.out_dir, self.prof, self.mon, interval_s=0, rank=self.rank
            )
            self._writer.start()
        except Exception as e:
            self._fail("rank file", e)

    def config(self) -> dict[str, Any]:
        """The settings, as printed at start and sent to W&B."""
        return {
            **self.schedule,
            "out_dir": str(self.out_dir),
            "flop_counter_step": self.flop_counter_step,
            "comm_logger_step": self.comm_logger_step,
            "memory_snapshot_step": self.memory_snapshot_step,
            "nsight": self.nsight,
            "tensorboard": self.use_tensorboard,
            "wandb": self.use_wandb,
            "record_shapes": self.record_shapes,
            "profile_memory": self.profile_memory,
            "with_stack": self.with_stack,
            "world_size": self.world_size,
        }

    def describe(self) -> str:
        s = self.schedule
        first = s["wait"] + s["warmup"]
        span = s["wait"] + s["warmup"] + s["active"]
        windows = [
            f"{first + i * span}-{first + i * span + s['active'] - 1}"
            for i in range(s["repeat"] or 1)
        ]
        lines = [
            f"meshprof performance_monitor: {self.world_size} rank(s), output in {self.out_dir}",
            f"  torch.profiler schedule: wait={s['wait']} warmup={s['warmup']} active={s['active']} repeat={s['repeat']} -> traces of steps {', '.join(windows)}{' (then every cycle)' if s['repeat'] == 0 else ''}"
            if self.use_profiler
            else "  torch.profiler: off",
            f"  FLOP counter: step {self.flop_counter_step}"
            if self.flop_counter_step is not None
            else "  FLOP counter: off",
            f"  communication log: step {self.comm_logger_step}"
            if self.comm_logger_step is not None
            else "  communication log: off",
            f"  memory snapshot: step {self.memory_snapshot_step}"
            if self.memory_snapshot_step is not None
            else "  memory snapshot: off",
            f"  nsight (NVTX): {'on' if self.nsight else 'off'}   tensorboard: {'on' if self.use_tensorboard else 'off'}   wandb: {'on' if self.use_wandb else 'off'}",
            f"  record_shapes={self.record_shapes} profile_memory={self.profile_memory} with_stack={self.with_stack}",
        ]
        return "\n".join(lines)

    def _start_profiler(self) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        s = self.schedule
        self._torch_prof = profile(
            activities=acts,
            schedule=schedule(
                wait=s["wait"], warmup=s["warmup"], active=s["active"], repeat=s["repeat"]
            ),
            on_trace_ready=self._trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        self._torch_prof.start()

    def _trace_ready(self, p: Any) -> None:
        try:
            step = self._cur_step
            path = self.out_dir / f"trace_rank{self.rank}_step{step}.json.gz"
            p.export_chrome_trace(str(path))
            self.files.append(path)
            key = "self_device_time_total" if self._cuda else "self_cpu_time_total"
            avgs = sorted(p.key_averages(), key=lambda a: getattr(a, key, 0.0), reverse=True)[:10]
            if self.rank == 0:
                basis = "device (CUDA)" if self._cuda else "CPU"
                table = p.key_averages().table(sort_by=key, row_limit=10)
                self._print(
                    f"meshprof: trace of the window ending at step {step} -> {path}\nmeshprof: ten most expensive ops by self {basis} time:\n{table}"
                )
            top = {f"prof/{a.key}_ms": getattr(a, key, 0.0) / 1000.0 for a in avgs}
            self._log(top, step)
            if self._writer is not None:
                self._writer.write()
        except Exception as e:
            self._fail("profiler trace", e)

    # -- around each step ---------------------------------------------------------------------------
    def _before(self) -> dict[str, Any]:
        st: dict[str, Any] = {}
        try:
            with self._lock:
                if not self.started:
                    self._start()
            if self.closed:
                return st
            self._flush_comm_log()
            self._flush_scalars()
            step = int(self.mon.current_step)
            self._cur_step = step
            st["step"] = step
            stack = ExitStack()
            st["stack"] = stack
            if self.nsight and self._cuda and self._ok("nvtx"):
                try:
                    import torch

                    torch.cuda.nvtx.range_push(f"step {step}")
                    stack.callback(torch.cuda.nvtx.range_pop)
                    if self.model is not None and "nvtx_hooks" not in st:
                        st["nvtx_hooks"] = self._nvtx_hooks()
                except Exception as e:
                    self._fail("nvtx", e)
            if step == self.memory_snapshot_step and self._cuda and self._ok("memory snapshot"):
                try:
                    import torch

                    torch.cuda.memory._record_memory_history(max_entries=100_000)
                    st["memsnap"] = True
                except Exception as e:
                    self._fail("memory snapshot", e)
            if step == self.comm_logger_step and self._ok("communication log"):
                try:
                    st["comm"] = self._start_comm_log()
                    if st["comm"]["mode"] is not None:
                        # its module tracker's full backward hooks warn when inputs need no grad
                        stack.enter_context(warnings.catch_warnings())
                        warnings.filterwarnings("ignore", message="Full backward hook is firing")
                        stack.enter_context(st["comm"]["mode"])
                except Exception as e:
                    self._fail("communication log", e)
                    st.pop("comm", None)
            if step == self.flop_counter_step and self._ok("FLOP counter"):
                try:
                    from torch.utils.flop_counter import FlopCounterMode

                    st["flops"] = stack.enter_context(FlopCounterMode(display=False))
                except Exception as e:
                    self._fail("FLOP counter", e)
            span = self.mon.step(tokens=self.tokens_per_step, samples=self.samples_per_step)
            span.__enter__()
            st["span"] = span
            st["t0"] = time.time_ns()
        except Exception as e:
            self._fail("monitor", e)
        return st

    def _after(self, st: dict[str, Any], error: bool) -> None:
        t1 = time.time_ns()
        try:
            span = st.get("span")
            if span is not None:
                span.__exit__(
                    RuntimeError if error else None, RuntimeError() if error else None, None
                )
            stack = st.get("stack")
            if stack is not None:
                stack.close()
            for h in st.get("nvtx_hooks", ()):
                h.remove()
        except Exception as e:
            self._fail("monitor", e)
        if "t0" not in st:
            return
        step, dur = st["step"], t1 - st["t0"]
        self.last_step_ns = dur
        if "flops" in st:
            try:
                self._finish_flops(st["flops"], step, dur)
            except Exception as e:
                self._fail("FLOP counter", e)
        if "comm" in st:
            # written at the next step (or close): asynchronous collectives of this step (DDP's
            # buckets) are recorded when their completion callback has run
            if st["comm"]["timeline"] is not None:
                st["comm"]["timeline"].remove()
            self._pending_comm = (st["comm"], step)
        if st.get("memsnap"):
            try:
                import torch

                path = self.out_dir / f"memory_snapshot_rank{self.rank}_step{step}.pickle"
                torch.cuda.memory._dump_snapshot(str(path))
                torch.cuda.memory._record_memory_history(enabled=None)
                self.files.append(path)
                if self.rank == 0:
                    self._print(
                        f"meshprof: memory snapshot -> {path} (open it in https://pytorch.org/memory_viz)"
                    )
            except Exception as e:
                self._fail("memory snapshot", e)
        if self._tb is not None or self._wandb is not None:
            # logged at the next step (or close), like the communication log: asynchronous
            # collectives of this step are recorded once their completion has been noticed
            self._pending_scalars = (step, st["t0"], t1)
        if self._torch_prof is not None and self._ok("profiler"):
            try:
                self._torch_prof.step()
            except Exception as e:
                self._fail("profiler", e)

    # -- FLOPs ----------------------------------------------------------------------------------------
    def _finish_flops(self, mode: Any, step: int, dur_ns: int) -> None:
        from meshprof.monitor.flops import mfu

        total = int(mode.get_total_flops())
        table = {
            mod: {str(op): int(n) for op, n in ops.items()}
            for mod, ops in mode.get_flop_counts().items()
        }
        self.flops_per_step = float(total)
        self.mon.flops_per_step = float(total)
        peak = getattr(self.mon, "peak_tflops", None)
        tflops, util = mfu(total, dur_ns / 1e9, peak)
        modules: dict[str, dict[str, Any]] = {
            m: {"total": sum(ops.values()), "ops": ops} for m, ops in table.items()
        }
        doc: dict[str, Any] = {
            "step": step,
            "rank": self.rank,
            "total_flops": total,
            "step_time_ns": dur_ns,
            "achieved_tflops": tflops,
            "peak_tflops": peak,
            "mfu": util,
            "modules": modules,
        }
        path = self._name(f"flops_step{step}", ".json")
        from meshprof.rundir import atomic_write_text

        atomic_write_text(path, json.dumps(doc, indent=2))
        self.files.append(path)
        if self.rank == 0:
            rows = sorted(((m, int(d["total"])) for m, d in modules.items()), key=lambda x: -x[1])
            width = max((len(m) for m, _ in rows), default=6)
            text = "\n".join(f"  {m:<{width}}  {n / 1e9:12.6f} GFLOP" for m, n in rows)
            mfu_txt = f"{util:.1%}" if util is not None else "n/a (set MESHPROF_PEAK_TFLOPS)"
            self._print(
                f"meshprof: FLOPs per module (step {step}):\n{text}\nmeshprof: step {step}: {total / 1e9:.6f} GFLOP, {tflops:.4f} TFLOP/s achieved, MFU {mfu_txt} (this step ran under the FLOP counter, so it was slower than usual)"
            )

    # -- communication log ------------------------------------------------------------------------------
    def _start_comm_log(self) -> dict[str, Any]:
        mode = None
        try:
            from torch.distributed.tensor.debug import CommDebugMode

            mode = CommDebugMode()
        except Exception:
            mode = None
        timeline = ModuleTimeline(self.model) if self.model is not None else None
        return {"mode": mode, "timeline": timeline}

    def _settle(self, step: int, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until no collective of ``step`` is in flight."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
            getattr(r, "step", None) == step for r in list(self.prof._inflight.values())
        ):
            time.sleep(0.001)

    def _flush_scalars(self) -> None:
        pending, self._pending_scalars = self._pending_scalars, None
        if pending is None:
            return
        step, t0, t1 = pending
        try:
            self._settle(step, 0.2)
            self._log(self._step_scalars(step, t0, t1), step)
        except Exception as e:
            self._fail("logging", e)

    def _flush_comm_log(self) -> None:
        pending, self._pending_comm = self._pending_comm, None
        if pending is None:
            return
        comm, step = pending
        try:
            deadline = time.monotonic() + COMM_SETTLE_S
            while time.monotonic() < deadline and any(
                getattr(r, "step", None) == step for r in list(self.prof._inflight.values())
            ):
                time.sleep(0.001)
            self._finish_comm_log(comm, step)
        except Exception as e:
            self._fail("communication log", e)

    def _finish_comm_log(self, comm: dict[str, Any], step: int) -> None:
        timeline: ModuleTimeline | None = comm["timeline"]
        events = [e for e in self.prof.events() if e.step == step]
        rows = []
        for e in events:
            module, phase = (
                timeline.attribute(e.start_ns) if timeline is not None else ("", "other")
            )
            d = e.to_dict()
            d.update(module=module, phase=phase)
            rows.append(d)
        mode = comm["mode"]
        dtensor: dict[str, Any] = {}
        table = ""
        if mode is not None:
            try:
                dtensor = {str(k): int(v) for k, v in mode.get_comm_counts().items()}
                table = _ANSI.sub("", mode.generate_comm_debug_tracing_table(noise_level=1))
            except Exception as e:
                table = f"(CommDebugMode table unavailable: {type(e).__name__}: {e})"
        by_module: dict[str, dict[str, int]] = {}
        for r in rows:
            key = f"{r['module'] or '(no module)'} [{r['phase']}]"
            by_module.setdefault(key, {})
            by_module[key][r["op"]] = by_module[key].get(r["op"], 0) + 1
        doc = {
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            "count": len(rows),
            "total_bytes": int(sum(max(r["in_bytes"], r["out_bytes"]) for r in rows)),
            "total_duration_ns": int(sum(max(r["duration_ns"], 0) for r in rows)),
            "by_module": by_module,
            "dtensor_comm_counts": dtensor,
            "events": rows,
        }
        from meshprof.render.console import fmt_bytes, fmt_ns
        from meshprof.rundir import atomic_write_text

        jpath = self._name(f"comm_step{step}", ".json")
        atomic_write_text(jpath, json.dumps(doc, indent=1, default=str))
        lines = [
            f"meshprof communication log: rank {self.rank}, step {step}, {len(rows)} collective(s)",
            "",
        ]
        lines.append(
            f"{'#':>4}  {'op':<16} {'group':<14} {'bytes':>10} {'time':>10}  {'phase':<9} module"
        )
        for i, r in enumerate(rows):
            lines.append(
                f"{i:>4}  {r['op']:<16} {r['group_desc'] or r['group_name']:<14} {fmt_bytes(max(r['in_bytes'], r['out_bytes'])):>10} {fmt_ns(r['duration_ns']):>10}  {r['phase']:<9} {r['module'] or '-'}"
            )
        lines += ["", "per module and phase:"] + [
            f"  {k}: {v}" for k, v in sorted(by_module.items())
        ]
        lines += [
            "",
            "DTensor CommDebugMode (DTensor collectives per module, forward/backward):",
            table.strip() or "(no DTensor collectives in this step)",
        ]
        tpath = self._name(f"comm_debug_step{step}", ".txt")
        atomic_write_text(tpath, "\n".join(lines) + "\n")
        self.files += [jpath, tpath]
        if self.rank == 0:
            self._print(
                f"meshprof: step {step}: {len(rows)} collective(s) logged -> {jpath}, {tpath}"
            )

    # -- scalars --------------------------------------------------------------------------------------
    def _step_scalars(self, step: int, t0: int, t1: int) -> dict[str, float]:
        from meshprof.monitor.flops import mfu

        dur = max(t1 - t0, 1)
        arr, _ = self.prof.columns()
        sel = arr[(arr["step"] == step) & (arr["duration_ns"] >= 0)]
        comm = _clipped_union(
            sel["start_ns"].astype(np.int64),
            (sel["start_ns"] + sel["duration_ns"]).astype(np.int64),
            t0,
            t1,
        )
        out = {
            "perf/step_time_ms": dur / 1e6,
            "perf/comm_share": comm / dur,
            "perf/collectives": float(len(sel)),
        }
        if self.flops_per_step:
            tflops, util = mfu(
                self.flops_per_step, dur / 1e9, getattr(self.mon, "peak_tflops", None)
            )
            out["perf/tflops"] = tflops
            if util is not None:
                out["perf/mfu"] = util
        return out

    def _log(self, values: dict[str, float], step: int) -> None:
        if self._tb is not None:
            try:
                self._tb.log(values, step)
            except Exception as e:
                self._fail("tensorboard", e)
                self._tb = None
        if self._wandb is not None:
            try:
                self._wandb.log(values, step)
            except Exception as e:
                self._fail("wandb", e)
                self._wandb = None

    def _nvtx_hooks(self) -> list[Any]:
        import torch

        def push(m: Any, a: Any) -> None:
            torch.cuda.nvtx.range_push("forward")

        def pop(m: Any, a: Any, o: Any) -> None:
            torch.cuda.nvtx.range_pop()

        return [self.model.register_forward_pre_hook(push), self.model.register_forward_hook(pop)]

    # -- end ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the profiler, write this rank's file, close the loggers. Safe to call twice."""
        if self.closed or not self.started:
            self.closed = True
            return
        self.closed = True
        self._flush_comm_log()
        self._flush_scalars()
        if self._torch_prof is not None:
            try:
                self._torch_prof.stop()
            except Exception as e:
                self._fail("profiler", e)
            self._torch_prof = None
        if self._writer is not None:
            try:
                self._writer.stop(final_write=True)
                if self._writer.last_path is not None:
                    self.files.append(self._writer.last_path)
            except Exception as e:
                self._fail("rank file", e)
        for name in ("_tb", "_wandb"):
            logger = getattr(self, name)
            if logger is not None:
                try:
                    logger.close()
                except Exception as e:
                    self._fail(name[1:], e)
                setattr(self, name, None)

    def __enter__(self) -> PerformanceMonitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _clipped_union(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> int:
    from meshprof.analyze.kineto import union_ns

    return union_ns(np.clip(starts, lo, hi), np.clip(ends, lo, hi))


def performance_monitor(
    model: Any = None, *, enabled: bool = True, **kwargs: Any
) -> PerformanceMonitor | _Off:
    """Build the monitor; decorate a training step with it (``@monitor``).

    Arguments: ``out_dir`` (run directory), ``wait``/``warmup``/``active``/``repeat``
    (torch.profiler schedule, in steps), ``flop_counter_step``, ``comm_logger_step``,
    ``memory_snapshot_step`` (step numbers, None = off), ``nsight`` (NVTX ranges on CUDA),
    ``tensorboard``, ``wandb`` (scalars; optional extras), ``record_shapes``, ``profile_memory``,
    ``with_stack`` (torch.profiler options), ``profiler`` (False: no torch.profiler),
    ``monitor`` (a StepMonitor to use; default: the current one or a new one),
    ``tokens_per_step``/``samples_per_step``. Call ``monitor.close()`` at the end of training
    (it is also done at exit). ``enabled=False`` gives an object whose decoration returns the
    function unchanged.
    """
    if not enabled:
        return _Off()
    mon = PerformanceMonitor(model, **kwargs)
    import atexit

    atexit.register(mon.close)
    return mon


__all__ = ["ModuleTimeline", "PerformanceMonitor", "performance_monitor"]
