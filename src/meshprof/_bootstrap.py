"""The worker side of ``meshprof run``: ``python -m meshprof._bootstrap (script.py | -m module) [args]``.

torchrun starts this in every worker. It turns meshprof on, then runs the user's unmodified
script as ``__main__`` with the ``sys.argv`` the script expects:

1. the collective recorder (:func:`meshprof.enable`);
2. the step monitor, with automatic step detection: every step of the first optimizer that
   steps ends a training step (``register_optimizer_step_post_hook`` -> ``monitor.mark_step()``);
3. the rank writer (:class:`meshprof.session.RankWriter`): the rank file is written every
   ``$MESHPROF_FLUSH_INTERVAL`` seconds, at exit, on an unhandled exception and on SIGTERM;
4. the hang watchdog (``$MESHPROF_HANG_TIMEOUT`` > 0), dumping into ``$MESHPROF_RUN_DIR/hang``;
5. a wrapper around ``torch.distributed.init_process_group`` that, once the default group
   exists, runs the clock synchronization exchange and writes a first rank file.

Setup problems are reported on stderr and never stop the script; the script's exit code and
exceptions pass through unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

USAGE = "usage: python -m meshprof._bootstrap (script.py | -m module) [args]"


def _warn(what: str, e: BaseException) -> None:
    with contextlib.suppress(Exception):
        print(
            f"meshprof: {what} failed, the script runs without it: {type(e).__name__}: {e}",
            file=sys.stderr,
        )


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


class WorkerSession:
    """What the bootstrap turned on in this worker (each part may be None if it failed)."""

    def __init__(self) -> None:
        self.prof: Any = None
        self.monitor: Any = None
        self.writer: Any = None
        self.watchdog: Any = None
        self.extra_meta: dict[str, Any] = {}
        self.steps_detected = 0
        self._primary_optimizer: int | None = None
        self._step_open = False
        self._forward_hook: Any = None

    # -- setup ------------------------------------------------------------------------------
    def setup(self, target: dict[str, Any]) -> None:
        from meshprof import launch

        run_dir = Path(os.environ.get(launch.ENV_RUN_DIR) or "meshprof-runs/worker")
        self.extra_meta.update(
            target=target,
            local_rank=int(os.environ.get("LOCAL_RANK", "0") or 0),
            node_rank=int(os.environ.get("GROUP_RANK", "0") or 0),
            node_id=os.environ.get(launch.ENV_NODE_ID, ""),
            torchrun_restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            bootstrap_start_ns=time.time_ns(),
        )
        if os.environ.get("WORLD_SIZE", "").isdigit():
            self.extra_meta["world_size"] = int(os.environ["WORLD_SIZE"])
        layout = os.environ.get(launch.ENV_LAYOUT, "")
        if layout:
            try:
                self.extra_meta["layout"] = launch.parse_layout(layout)
            except Exception as e:
                _warn("reading $MESHPROF_LAYOUT", e)
        elif os.environ.get("WORLD_SIZE", "").isdigit():
            # no layout given: assume pure data parallelism over all ranks (said in the meta)
            self.extra_meta["layout"] = {"dp": int(os.environ["WORLD_SIZE"]), "tp": 1, "pp": 1}
            self.extra_meta["layout_assumed"] = True
        try:
            import meshprof
            from meshprof.config import ProfilerConfig

            max_events = os.environ.get(launch.ENV_MAX_EVENTS, "")
            config = ProfilerConfig(max_events=int(max_events)) if max_events.isdigit() else None
            self.prof = meshprof.enable(config)
        except Exception as e:
            _warn("enabling the recorder", e)
            return
        try:
            from meshprof.monitor import StepMonitor

            self.monitor = StepMonitor(self.extra_meta.get("layout"), profiler=self.prof)
        except Exception as e:
            _warn("creating the step monitor", e)
        if os.environ.get(launch.ENV_STEP_DETECT, "optimizer") == "optimizer":
            try:
                from torch.nn.modules.module import register_module_forward_pre_hook
                from torch.optim.optimizer import register_optimizer_step_post_hook

                register_optimizer_step_post_hook(self._on_optimizer_step)
                self._forward_hook = register_module_forward_pre_hook(self._on_first_forward)
                self.extra_meta["step_detection"] = "optimizer"
            except Exception as e:
                _warn("automatic step detection", e)
        try:
            from meshprof.session import RankWriter

            interval = _env_float(launch.ENV_FLUSH_INTERVAL, 30.0)
            self.writer = RankWriter(
                run_dir, self.prof, self.monitor, interval, extra_meta=self.extra_meta
            ).start()
        except Exception as e:
            _warn("starting the rank writer", e)
        hang_timeout = _env_float(launch.ENV_HANG_TIMEOUT, 0.0)
        if hang_timeout > 0:
            try:
                from meshprof.tools.watchdog import start_watchdog

                self.watchdog = start_watchdog(self.prof, run_dir / launch.HANG_DIR, hang_timeout)
                self.extra_meta["hang_timeout_s"] = hang_timeout
            except Exception as e:
                _warn("starting the hang watchdog", e)
        try:
            self._wrap_init_process_group()
        except Exception as e:
            _warn("wrapping init_process_group (no clock sync)", e)

    def _open_first_step(self) -> None:
        if self._step_open:
            return
        self._step_open = True
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None
        if self.monitor is not None:
            self.monitor.mark_step()

    def _on_first_forward(self, module: Any, args: Any) -> None:
        """Step 0 starts at the first forward of any module (model building is not a step)."""
        try:
            self._open_first_step()
        except Exception as e:
            self._internal_error(e)

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Each step of the first optimizer that steps ends a step and starts the next one (the
        step left open after the last optimizer step is never closed: it is not a step)."""
        try:
            # With several optimizers (GANs, per-module optimizers) one of them marks the step.
            if self._primary_optimizer is None:
                self._primary_optimizer = id(optimizer)
            if id(optimizer) != self._primary_optimizer:
                return
            self.steps_detected += 1
            self.extra_meta["steps_detected"] = self.steps_detected
            if not self._step_open:  # no forward seen: the step starts now, with its optimizer
                self._open_first_step()
                return
            if self.monitor is not None:
                self.monitor.mark_step()
            elif self.prof is not None:
                self.prof.step = self.steps_detected
        except Exception as e:
            self._internal_error(e)

    def _internal_error(self, e: BaseException) -> None:
        with contextlib.suppress(Exception):
            self.prof._internal_error(e)

    def _wrap_init_process_group(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        original = c10d.init_process_group
        session = self

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            session._after_init()
            return result

        c10d.init_process_group = init_process_group
        dist.init_process_group = init_process_group
        dm = sys.modules.get("torch.distributed.device_mesh")
        if dm is not None and getattr(dm, "init_process_group", None) is original:
            dm.init_process_group = init_process_group  # type: ignore[attr-defined]

    def _after_init(self) -> None:
        """Runs on every rank right after the default group exists: a collective point."""
        try:
            import torch.distributed as dist

            self.extra_meta["world_size"] = dist.get_world_size()
            self.extra_meta["backend"] = str(dist.get_backend())
            if dist.get_world_size() > 1:
                from meshprof.comm.clocksync import exchange_timestamps

                self.extra_meta["clock_sync"] = exchange_timestamps()
        except Exception as e:
            _warn("clock synchronization", e)
        if self.writer is not None:
            self.writer.write()

    # -- the script -------------------------------------------------------------------------
    def set_exit(self, how: str, code: int | None, error: str = "") -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.set_exit(how, code, error)


def _exit_code(code: Any) -> int:
    """The process exit status Python gives ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def run_target(session: WorkerSession, target: dict[str, Any]) -> None:
    """Run the script or module as ``__main__``; record how it ended; re-raise what it raised."""
    args = list(target["args"])
    try:
        if target["kind"] == "module":
            sys.argv = [target["name"], *args]
            runpy.run_module(target["name"], run_name="__main__", alter_sys=True)
        else:
            script = target["name"]
            sys.argv = [script, *args]
            sys.path[0] = str(Path(script).resolve().parent)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
        session.set_exit("normal" if code == 0 else "exit", code)
        raise
    except BaseException as e:
        session.set_exit("exception", 1, f"{type(e).__name__}: {e}")
        raise
    session.set_exit("normal", 0)


def parse_argv(argv: list[str]) -> dict[str, Any]:
    """``[script, args...]`` or ``["-m", module, args...]`` -> target dict."""
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    if argv[0] == "-m":
        return {"kind": "module", "name": argv[1], "args": argv[2:]}
    return {"kind": "script", "name": argv[0], "args": argv[1:]}


def main() -> None:
    target = parse_argv(sys.argv[1:])
    session = WorkerSession()
    try:
        session.setup(target)
    except Exception as e:
        _warn("meshprof setup", e)
    run_target(session, target)


if __name__ == "__main__":
    main()
