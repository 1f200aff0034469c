"""One recording session in a training process: recorder, step monitor, rank writer, manifest,
clock sync and hang watchdog, turned on and off together.

``meshprof run``'s worker bootstrap, ``@performance_monitor``, the demo and the tests all build
their recording through :class:`RecordingSession`, configured by :class:`SessionConfig`::

    session = RecordingSession(SessionConfig(run_dir="runs/x", flush_interval_s=10)).start()
    ...  # training; session.monitor.step() / mark_step(), session.prof is the recorder
    session.stop()  # last rank-file write

Everything here runs inside the user's training process: every part is optional, a part that
fails is switched off and reported once (on stderr, or through ``on_error``), and nothing raises
into training.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from meshprof.monitor.step_detect import STEP_DETECT_MODES, StepDetector, step_detect_mode
from meshprof.process import process_rank
from meshprof.records.captures import CaptureLimits
from meshprof.records.serving import ServiceLevels
from meshprof.rundir.schema import HANG_DIR, Manifest

if TYPE_CHECKING:
    from meshprof.comm.recorder import CommProfiler
    from meshprof.config import ProfilerConfig
    from meshprof.monitor.step_monitor import StepMonitor
    from meshprof.rundir.segment_writer import StorageLimits
    from meshprof.rundir.writer import RankWriter
    from meshprof.session.capture_agent import CaptureAgent
    from meshprof.session.live_publish import LivePublisher
    from meshprof.session.watchdog import Watchdog


@dataclass(kw_only=True, slots=True)
class SessionConfig:
    """What a :class:`RecordingSession` turns on."""

    run_dir: Path | None = None
    """Run directory for the rank file, the manifest and hang dumps. None: no rank writer."""
    rank: int | None = None
    """Rank in the rank file's name and meta. None: ``$RANK``, else the default group's rank
    once it exists, else 0."""
    flush_interval_s: float = 30.0
    """Seconds between periodic rank-file writes; 0: only at stop(), at exit and on SIGTERM."""
    live_interval_s: float = 1.0
    """Seconds between two live-state records (``RUN_DIR/live/rank{R}.json``, read by
    ``meshprof top``/``serve`` and the Prometheus exporter); 0: none. Needs ``run_dir``."""
    profiler: ProfilerConfig | None = None
    """Recorder settings for :func:`meshprof.enable`; None: its defaults (an enabled recorder
    is reused)."""
    monitor: bool = True
    """Create a StepMonitor (layout, this rank) unless one is passed to the session or one is
    already active (:func:`meshprof.monitor.get_monitor`)."""
    layout: object = None
    """dp/tp/pp layout: a Layout, a ``{"dp", "tp", "pp"}`` dict, "dp=2,tp=1,pp=2", a
    ParallelConfig or RankMapping. Given to the step monitor and written into the rank meta's
    ``layout`` (a dict as given, anything else as ``{"dp", "tp", "pp"}``)."""
    step_detection: str | bool = False
    """Automatic steps (``meshprof run``), one of :data:`STEP_DETECT_MODES`: "optimizer" (the
    first module forward opens step 0 and every step of the first optimizer that steps ends a
    step), "forward" (each outermost module forward call is a step), "auto" (optimizer steps when
    the script steps an optimizer, else forward steps: see :meth:`RecordingSession._on_forward_pre`),
    "off". True means "optimizer", False "off"."""
    clock_sync: bool = True
    """When the default group exists (world size > 1), exchange timestamps with the other ranks
    (:func:`meshprof.comm.clocksync.exchange_timestamps`; the report aligns clocks with them).
    Done in :meth:`RecordingSession.on_process_group_ready`, which :meth:`start` calls itself
    when a group already exists. False: that call is left to the caller."""
    wrap_init_process_group: bool = False
    """Wrap ``torch.distributed.init_process_group`` so that on_process_group_ready() runs right
    after it (``meshprof run``, where the script creates the group)."""
    capture: bool = False
    """Start the capture agent: this rank answers ``meshprof capture`` and ``meshprof stacks``
    requests posted in ``run_dir`` (:mod:`meshprof.session.capture_agent`). Needs ``run_dir``."""
    capture_limits: CaptureLimits | None = None
    """What those requests may ask of the rank (None: the defaults of
    :class:`~meshprof.records.captures.CaptureLimits`: the job's user's requests only)."""
    hang_timeout_s: float = 0.0
    """> 0: start the hang watchdog: an op in flight this many seconds dumps into ``hang_dir``."""
    hang_dir: Path | None = None
    """Where the watchdog dumps; None: ``run_dir / "hang"``."""
    manifest: Manifest | None = None
    """Written as ``run_dir/manifest.json`` by rank 0 in start() (None: not written; under
    ``meshprof run`` the launcher writes it)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Extra rank-meta fields (RankMeta keys such as "target" or "node_id", or free-form keys,
    kept as they are). The session adds world_size, backend, clock_sync, layout,
    step_detection, steps_detected and hang_timeout_s itself."""
    storage: StorageLimits | None = None
    """Retention and sync bounds of the rank's segments (None: the defaults of
    :class:`~meshprof.rundir.segment_writer.StorageLimits`, fsyncs every
    ``flush_interval_s``)."""
    run_id: str | None = None
    """The run's id, written into every file of the rank (``meshprof run``)."""
    monitor_rows: int = 0
    """Spans and memory samples the step monitor keeps in memory (0: its own limit, a million):
    the rank writer appends them to the segments every tick, so a small bound (``meshprof run``
    keeps 16,384) keeps a weeks-long run's memory flat."""
    slo: ServiceLevels | None = None
    """Service levels a serving rank's live goodput and SLO attainment count against
    (``meshprof run --slo``)."""
    serving_hooks: bool = False
    """Recognize Hugging Face ``generate()`` calls as serving (each batch row a request, the
    forwards prefill and decode steps: :mod:`meshprof.monitor.hf_generate`); ``meshprof
    run`` turns it on."""
    on_error: Callable[[str, BaseException], None] | None = None
    """Called once per failed part (see :data:`PARTS`) instead of the default stderr line
    ("meshprof: <what> failed, the script runs without it: ...")."""


#: The parts of a session, as named to ``on_error`` -> what the default warning says failed.
PARTS = {
    "recorder": "enabling the recorder",
    "step monitor": "creating the step monitor",
    "step detection": "automatic step detection",
    "serving hooks": "recognizing Hugging Face generate() as serving",
    "rank writer": "starting the rank writer",
    "live state": "publishing the live state",
    "watchdog": "starting the hang watchdog",
    "capture agent": "starting the capture agent (meshprof capture, meshprof stacks)",
    "manifest": "writing the manifest",
    "init wrapper": "wrapping init_process_group (no clock sync)",
    "clock sync": "clock synchronization",
}


def warn_part_failed(part: str, e: BaseException) -> None:
    """The default ``on_error``: one line on stderr (never raises)."""
    with contextlib.suppress(Exception):
        print(
            f"meshprof: {PARTS.get(part, part)} failed, the script runs without it: "
            f"{type(e).__name__}: {e}",
            file=sys.stderr,
        )


class RecordingSession:
    """Recorder + step monitor + rank writer + manifest + clock sync + watchdog of one process.

    Each attribute is None when its part is off or failed; :attr:`failures` says why."""

    def __init__(
        self, config: SessionConfig | None = None, *, monitor: StepMonitor | None = None
    ) -> None:
        self.config = config if config is not None else SessionConfig()
        self.prof: CommProfiler | None = None
        self.monitor: StepMonitor | None = monitor
        self.writer: RankWriter | None = None
        self.watchdog: Watchdog | None = None
        self.live: LivePublisher | None = None
        self.capture_agent: CaptureAgent | None = None
        self.meta: dict[str, Any] = dict(self.config.meta)
        """The rank-meta fields the writer adds at every write (kept up to date; mutable)."""
        self.failures: dict[str, str] = {}
        """part -> "Type: message" of the error that switched it off."""
        self.steps = StepDetector(self)
        """Automatic step detection (optimizer steps or forward calls): see
        :mod:`meshprof.monitor.step_detect`."""
        self._wrapped: tuple[Any, Any] | None = None  # (original, wrapper)
        self._started = False

    @property
    def steps_detected(self) -> int:
        """Steps made by automatic step detection (optimizer steps, or forward calls)."""
        return self.steps.steps_detected

    @property
    def step_mode(self) -> str:
        """Step detection in effect: "optimizer", "forward", "off", or "auto" while undecided."""
        return self.steps.mode

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> RecordingSession:
        """Turn every configured part on (each failure is reported and that part left off)."""
        if self._started:
            return self
        self._started = True
        cfg = self.config
        self._note_layout()
        try:
            from meshprof.api import enable

            self.prof = enable(cfg.profiler)
        except Exception as e:
            self._fail("recorder", e)
            return self
        if self.monitor is None and cfg.monitor:
            self._start_monitor()
        if cfg.step_detection:
            try:
                self.steps.start(cfg.step_detection)
            except Exception as e:
                self._fail("step detection", e)
        if cfg.serving_hooks:
            try:
                from meshprof.monitor import hf_generate

                hf_generate.install(lambda: self.monitor, self.steps.decide_inference)
            except Exception as e:
                self._fail("serving hooks", e)
        if cfg.run_dir is not None:
            self._start_writer(Path(cfg.run_dir))
            if cfg.live_interval_s > 0:
                self._start_live(Path(cfg.run_dir))
            if cfg.capture:
                self._start_capture_agent(Path(cfg.run_dir))
        if cfg.hang_timeout_s > 0:
            self._start_watchdog()
        if cfg.manifest is not None and cfg.run_dir is not None and self.rank() == 0:
            try:
                from meshprof.rundir.manifest import write_manifest

                write_manifest(cfg.run_dir, cfg.manifest)
            except Exception as e:
                self._fail("manifest", e)
        if cfg.wrap_init_process_group:
            try:
                self._wrap_init_process_group()
            except Exception as e:
                self._fail("init wrapper", e)
        elif cfg.clock_sync and _default_group_exists():
            self.on_process_group_ready()
        return self

    def on_process_group_ready(self) -> None:
        """Right after the default group exists, on every rank (a collective point when
        ``clock_sync``): world size and backend into the meta, the timestamp exchange, and a
        first rank-file write."""
        try:
            import torch.distributed as dist

            self.meta["world_size"] = dist.get_world_size()
            self.meta["backend"] = str(dist.get_backend())
            if self.config.clock_sync and dist.get_world_size() > 1:
                from meshprof.comm.clocksync import exchange_timestamps

                self.meta["clock_sync"] = exchange_timestamps()
        except Exception as e:
            self._fail("clock sync", e)
        self.write()

    def attach_monitor(self, monitor: StepMonitor) -> None:
        """Use ``monitor`` from now on (built after start(), e.g. once the model exists)."""
        self.monitor = monitor
        self._bound_monitor()
        if self.writer is not None:
            self.writer.monitor = monitor
        if self.live is not None:
            self.live.monitor = monitor
            if self.live.counters.layout is None:
                self.live.counters.layout = getattr(monitor, "layout", None)

    def settle_steps(self) -> None:
        """The script has ended: auto step detection still undecided after forwards and no
        optimizer step makes those forwards steps (an inference script that kept autograd on)."""
        self.steps.settle()

    def set_exit(self, how: str, code: int | None = None, error: str = "") -> None:
        """Record how the process ended ("normal", "exit", "exception", "signal"); settles
        automatic step detection (:meth:`settle_steps`)."""
        self.settle_steps()
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.set_exit(how, code, error)
        if self.live is not None:
            self.live.set_exit(how)

    def write(self, force: bool = False) -> Path | None:
        """Write the rank file now; its path, or None (skipped, failed, or no writer)."""
        if self.writer is None:
            return None
        return self.writer.write(force)

    def stop(self, final_write: bool = True) -> None:
        """Stop the watchdog, remove the hooks and the init wrapper, stop the writer (with a
        last write by default). The recorder stays enabled (:func:`meshprof.disable` ends it)."""
        if self.watchdog is not None:
            with contextlib.suppress(Exception):
                self.watchdog.stop()
        if self.capture_agent is not None:
            with contextlib.suppress(Exception):
                self.capture_agent.stop()
            self.capture_agent = None
        self.settle_steps()
        self.steps.remove_hooks()
        if self.config.serving_hooks:
            with contextlib.suppress(Exception):
                from meshprof.monitor import hf_generate

                hf_generate.uninstall()
        self._unwrap_init_process_group()
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.stop(final_write)
        if self.live is not None:
            with contextlib.suppress(Exception):
                self.live.stop(self.live.exit_how or "normal")
            self.live = None
        self._started = False

    def rank(self) -> int:
        """This process' rank: the configured one, else :func:`process_rank`."""
        return self.config.rank if self.config.rank is not None else process_rank()

    def __enter__(self) -> RecordingSession:
        return self.start()

    def __exit__(
        self,
        etype: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if value is not None:
            self.set_exit("exception", 1, f"{type(value).__name__}: {value}")
        self.stop()

    # -- parts ----------------------------------------------------------------------------------
    def _fail(self, part: str, e: BaseException) -> None:
        if part in self.failures:
            return
        self.failures[part] = f"{type(e).__name__}: {e}"
        report = self.config.on_error or warn_part_failed
        with contextlib.suppress(Exception):
            report(part, e)

    def _note_layout(self) -> None:
        layout = self.config.layout
        if layout is None:
            return
        try:
            from meshprof.layout import Layout

            if isinstance(layout, dict):
                self.meta["layout"] = dict(layout)
            else:
                lay = Layout.from_any(layout)
                if lay is not None:
                    self.meta["layout"] = lay.to_dict()
        except Exception as e:
            self._fail("step monitor", e)

    def _layout(self, layout: object) -> object:
        """``layout`` as the monitor and the live state get it: marked assumed
        (:attr:`meshprof.layout.Layout.assumed`) when the meta says nobody gave it, so that the
        job's DeviceMesh names name the groups they cover."""
        if layout is None or self.meta.get("layout_assumed") is not True:
            return layout
        from meshprof.layout import Layout

        lay = Layout.from_any(layout)
        return Layout(lay.dp, lay.tp, lay.pp, assumed=True) if lay is not None else layout

    def _start_monitor(self) -> None:
        try:
            from meshprof.api import StepMonitor
            from meshprof.monitor import get_monitor

            self.monitor = get_monitor() or StepMonitor(
                self._layout(self.config.layout), profiler=self.prof, rank=self.config.rank
            )
            self._bound_monitor()
        except Exception as e:
            self._fail("step monitor", e)

    def _bound_monitor(self) -> None:
        rows = self.config.monitor_rows
        if rows > 0 and self.monitor is not None and self.config.run_dir is not None:
            with contextlib.suppress(Exception):
                self.monitor.keep_rows(rows)

    def _start_writer(self, run_dir: Path) -> None:
        try:
            from meshprof.rundir.writer import RankWriter

            assert self.prof is not None
            self.writer = RankWriter(
                run_dir,
                self.prof,
                self.monitor,
                self.config.flush_interval_s,
                rank=self.config.rank,
                extra_meta=self.meta,
                limits=self.config.storage,
                run_id=self.config.run_id,
            ).start()
        except Exception as e:
            self._fail("rank writer", e)

    def _start_live(self, run_dir: Path) -> None:
        try:
            import atexit

            from meshprof.session.live_publish import LivePublisher

            assert self.prof is not None
            layout = self._layout(self.meta.get("layout") or self.config.layout)
            self.live = LivePublisher(
                run_dir,
                self.prof,
                self.monitor,
                self.config.live_interval_s,
                rank=self.config.rank,
                layout=layout,
                extra=self.meta,
                slo=self.config.slo,
            )
            if self.writer is not None:
                self.live.storage_state = lambda: self.writer.storage_state if self.writer else ""
            self.live.start()
            atexit.register(self._live_at_exit)
        except Exception as e:
            self._fail("live state", e)

    def _live_at_exit(self) -> None:
        live = self.live
        if live is not None:
            with contextlib.suppress(Exception):
                live.stop(live.exit_how or "normal")

    def _start_capture_agent(self, run_dir: Path) -> None:
        try:
            import atexit

            from meshprof.session.capture_agent import start_capture_agent

            self.capture_agent = start_capture_agent(run_dir, self, self.config.capture_limits)
            atexit.register(self._capture_at_exit)
        except Exception as e:
            self._fail("capture agent", e)

    def _capture_at_exit(self) -> None:
        """A capture still tracing when the script ends is stopped and written."""
        agent = self.capture_agent
        if agent is not None:
            with contextlib.suppress(Exception):
                agent.stop()

    def _start_watchdog(self) -> None:
        cfg = self.config
        dump_dir = cfg.hang_dir or (Path(cfg.run_dir) / HANG_DIR if cfg.run_dir else None)
        if dump_dir is None:
            return
        try:
            from meshprof.session.watchdog import start_watchdog

            inside = cfg.hang_dir is None or (
                cfg.run_dir is not None and Path(cfg.run_dir) in Path(cfg.hang_dir).parents
            )
            self.watchdog = start_watchdog(
                self.prof,
                dump_dir,
                cfg.hang_timeout_s,
                within=Path(cfg.run_dir) if inside and cfg.run_dir is not None else None,
            )
            self.meta["hang_timeout_s"] = cfg.hang_timeout_s
        except Exception as e:
            self._fail("watchdog", e)

    def report_internal_error(self, e: BaseException) -> None:
        """Count an error of meshprof's own (never raises into training)."""
        if self.prof is not None:
            with contextlib.suppress(Exception):
                self.prof.report_internal_error(e)

    # -- init_process_group -----------------------------------------------------------------------
    def _wrap_init_process_group(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        original = c10d.init_process_group
        session = self

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            session.on_process_group_ready()
            return result

        c10d.init_process_group = init_process_group
        dist.init_process_group = init_process_group
        dm = sys.modules.get("torch.distributed.device_mesh")
        if dm is not None and getattr(dm, "init_process_group", None) is original:
            dm.init_process_group = init_process_group  # type: ignore[attr-defined]
        self._wrapped = (original, init_process_group)

    def _unwrap_init_process_group(self) -> None:
        if self._wrapped is None:
            return
        original, wrapper = self._wrapped
        self._wrapped = None
        with contextlib.suppress(Exception):
            import torch.distributed as dist
            import torch.distributed.distributed_c10d as c10d

            for mod in (c10d, dist, sys.modules.get("torch.distributed.device_mesh")):
                if mod is not None and getattr(mod, "init_process_group", None) is wrapper:
                    setattr(mod, "init_process_group", original)  # noqa: B010


def _default_group_exists() -> bool:
    try:
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized())
    except Exception:
        return False


__all__ = [
    "PARTS",
    "STEP_DETECT_MODES",
    "RecordingSession",
    "SessionConfig",
    "step_detect_mode",
    "warn_part_failed",
]
