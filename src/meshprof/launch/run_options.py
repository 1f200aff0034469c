"""What ``meshprof run`` was asked to do: :class:`RunOptions`, validated on construction."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from meshprof.analyze.live.alert_config import AlertConfig
from meshprof.analyze.live.capture_targets import CaptureConfig
from meshprof.errors import MeshprofError
from meshprof.live.otel.settings import OtlpSettings
from meshprof.monitor.step_detect import STEP_DETECT_MODES
from meshprof.records.captures import CaptureLimits

_NNODES_RE = re.compile(r"^\d+(:\d+)?$")


@dataclass(kw_only=True, slots=True)
class RunOptions:
    """What ``meshprof run`` was asked to do. Validated on construction (bad values raise
    :class:`MeshprofError`)."""

    script: str | None = None
    """Path of the training script (exclusive with ``module``)."""
    module: str | None = None
    """Module to run as ``python -m module`` (exclusive with ``script``)."""
    args: list[str] = field(default_factory=list)
    """Arguments passed to the script (its ``sys.argv[1:]``)."""
    run_dir: Path | None = None
    """Run directory; None picks ./meshprof-runs/<rdzv id or timestamp>."""
    nproc_per_node: str = "1"
    """Workers per node: a count, or torchrun's "gpu", "cpu", "auto"."""
    nnodes: str = "1"
    """Number of nodes, "N" or "MIN:MAX"."""
    node_rank: int = 0
    """This node's rank (static rendezvous)."""
    torchrun: dict[str, str] = field(default_factory=dict)
    """Other torchrun options passed through, name (e.g. "rdzv-endpoint") -> value."""
    standalone: bool | None = None
    """torchrun --standalone; None: on for a single node with no rendezvous/master given."""
    flush_interval_s: float = 30.0
    """Seconds between two periodic writes of each rank file."""
    hang_timeout_s: float = 300.0
    """Seconds a collective may stay in flight before the watchdog dumps (0: no watchdog)."""
    hang_action: str = "kill"
    """What the launcher does after a hang dump: "kill" ends the job, "wait" lets it run on."""
    step_detect: str = "auto"
    """Automatic step detection: "auto" (optimizer steps when the script steps an optimizer,
    else each outermost module forward call), "optimizer", "forward" or "off"."""
    live_interval_s: float = 1.0
    """Seconds between two live-state records of each rank (``RUN_DIR/live/``); 0: none."""
    alerts: AlertConfig = field(default_factory=AlertConfig)
    """Live alert rules the launcher evaluates while the job runs (needs the live state)."""
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    """Captures on alerts (``--capture-on``; needs the live alerts)."""
    capture_agent: bool = True
    """Every rank answers ``meshprof capture`` and ``meshprof stacks`` (False: ``--no-capture``,
    no agent thread in the workers)."""
    requests_from_any_user: bool = False
    """The ranks take capture and stacks requests written by any user who can write the run
    directory (``--requests-from-any-user``); by default only the job's own user's."""

    @property
    def capture_limits(self) -> CaptureLimits:
        """What requests may ask of the ranks: the captures' disk budget, at most
        max(12, ``--capture-max-per-hour``) captures an hour per rank, whose requests."""
        return CaptureLimits(
            max_bytes=self.capture.max_bytes,
            max_per_hour=max(CaptureLimits().max_per_hour, self.capture.max_per_hour),
            any_user=self.requests_from_any_user,
        )

    max_events: int | None = None
    """Ring-buffer capacity of each rank's recorder (None: the recorder's default)."""
    metrics_port: int | None = None
    """Serve Prometheus ``/metrics`` for this node's ranks on this port (None: off)."""
    metrics_addr: str = "127.0.0.1"
    """Address the metrics endpoint binds."""
    otlp: OtlpSettings | None = None
    """Send the live figures and the steps over OTLP from each node's launcher
    (``--otlp-endpoint`` or the ``OTEL_EXPORTER_OTLP_*`` variables; None: off)."""
    retain_s: float = 0.0
    """Each rank's segments older than this are deleted (seconds; 0: no age bound)."""
    max_disk_bytes: int = 1 << 30
    """Each rank's files are kept under this size by deleting its oldest segments (bytes; 0:
    no bound). The per-step totals are kept for the whole run."""
    slo: str = ""
    """Service levels of a serving job (``--slo ttft=200ms,tpot=50ms``; "" none): the live
    goodput and SLO attainment count against them."""
    report: bool = True
    """Print the job's cross-rank report at the end (node 0 only)."""
    command: list[str] = field(default_factory=list)
    """The command line as typed (for the manifest)."""

    def __post_init__(self) -> None:
        if (self.script is None) == (self.module is None):
            raise MeshprofError(
                "give a training script (meshprof run [options] script.py [args]) or -m module"
            )
        if self.script is not None and not Path(self.script).is_file():
            raise MeshprofError(f"{self.script}: no such script file")
        if self.module is not None and not re.match(r"^[A-Za-z_][\w.]*$", self.module):
            raise MeshprofError(f"-m {self.module!r}: not a module name")
        npn = self.nproc_per_node
        if not (npn in ("gpu", "cpu", "auto") or (npn.isdigit() and int(npn) >= 1)):
            raise MeshprofError(
                f"--nproc-per-node {npn!r}: expected a positive integer, gpu, cpu or auto"
            )
        if not _NNODES_RE.match(self.nnodes) or int(self.nnodes.split(":")[0]) < 1:
            raise MeshprofError(
                f"--nnodes {self.nnodes!r}: expected N or MIN:MAX (positive integers)"
            )
        if self.node_rank < 0:
            raise MeshprofError(f"--node-rank {self.node_rank}: must be >= 0")
        if not self.flush_interval_s > 0:
            raise MeshprofError(f"--flush-interval {self.flush_interval_s}: must be > 0 seconds")
        if not self.hang_timeout_s >= 0:
            raise MeshprofError(
                f"--hang-timeout {self.hang_timeout_s}: must be >= 0 seconds (0 turns the watchdog off)"
            )
        if self.hang_action not in ("kill", "wait"):
            raise MeshprofError(f"--hang-action {self.hang_action!r}: expected kill or wait")
        if self.step_detect not in STEP_DETECT_MODES:
            raise MeshprofError(
                f"--step-detect {self.step_detect!r}: expected {', '.join(STEP_DETECT_MODES)}"
            )
        if not self.live_interval_s >= 0:
            raise MeshprofError(
                f"--live-interval {self.live_interval_s}: must be >= 0 seconds (0 turns it off)"
            )
        if self.capture.enabled and not (self.alerts.enabled and self.live_interval_s > 0):
            raise MeshprofError(
                "--capture-on needs the live alerts (drop --no-alerts, --live-interval > 0)"
            )
        if self.capture.enabled and not self.capture_agent:
            raise MeshprofError("--capture-on needs the ranks' capture agent (drop --no-capture)")
        if self.max_events is not None and self.max_events < 1:
            raise MeshprofError(f"--max-events {self.max_events}: must be >= 1")
        if not self.retain_s >= 0:
            raise MeshprofError(f"--retain {self.retain_s}: must be >= 0 seconds (0: no bound)")
        if self.max_disk_bytes < 0:
            raise MeshprofError(f"--max-disk {self.max_disk_bytes}: must be >= 0 (0: no bound)")
        if self.metrics_port is not None:
            from meshprof.live.metrics import check_metrics_options

            check_metrics_options(self.metrics_port, self.live_interval_s)
        if self.otlp is not None:
            from meshprof.live.otel.settings import check_installed

            check_installed(self.otlp)
            if self.otlp.metrics is not None and not self.live_interval_s > 0:
                raise MeshprofError(
                    "OTLP metrics need the live state (a --live-interval above 0; or "
                    "OTEL_METRICS_EXPORTER=none)"
                )

    @property
    def world_size(self) -> int | None:
        """nnodes × nproc_per_node when both are known numbers (the maximum for MIN:MAX)."""
        if not self.nproc_per_node.isdigit():
            return None
        return int(self.nnodes.split(":")[-1]) * int(self.nproc_per_node)

    def default_name(self) -> str:
        """The default run directory's name when the job has one of its own: the rendezvous id
        (shared by every node); "" otherwise (the run id is used)."""
        rdzv_id = self.torchrun.get("rdzv-id")
        return rdzv_id if rdzv_id and rdzv_id != "none" else ""

    def resolved_run_dir(self, name: str) -> Path:
        """``-o`` (absolute), else ``./meshprof-runs/<name>``."""
        if self.run_dir is not None:
            return Path(self.run_dir).absolute()
        return Path("meshprof-runs").absolute() / name
