"""What ``meshprof run``'s launcher tells its workers: one JSON record in one environment
variable (:data:`WORKER_ENV`), read back by the torchrun wrapper and by every worker's bootstrap
(:mod:`meshprof.launch`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from meshprof.records.captures import CaptureLimits
from meshprof.records.codec import from_json, to_json

WORKER_ENV = "MESHPROF_WORKER"
"""The environment variable that carries :class:`WorkerSettings` as JSON."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """The recording session of every worker of one ``meshprof run`` job."""

    run_dir: str
    """The run directory (absolute)."""
    node_id: str = ""
    """The launcher (node) the worker runs under."""
    worker_exits: str = ""
    """The file where torchrun's wrapper records how failed workers ended ("" none)."""
    flush_interval_s: float = 30.0
    """Seconds between two periodic writes of each rank file."""
    hang_timeout_s: float = 0.0
    """Seconds a collective may stay in flight before the watchdog dumps (0: no watchdog)."""
    step_detect: str = "auto"
    """Automatic step detection: auto, optimizer, forward or off."""
    live_interval_s: float = 1.0
    """Seconds between two live-state records of each rank (0: none)."""
    capture: bool = True
    """Start the capture agent: the rank answers ``meshprof capture`` and ``meshprof stacks``."""
    capture_limits: CaptureLimits = field(default_factory=CaptureLimits)
    """What requests may ask of the ranks (steps, disk, rate, activities, whose requests)."""
    max_events: int | None = None
    """Ring-buffer capacity of each rank's recorder (None: the recorder's default)."""
    layout: str = ""
    """The dp × tp × pp layout as given (``--layout`` or ``$MESHPROF_LAYOUT``; "" unknown)."""
    run_id: str = ""
    """The run's id ("" until the launchers of a multi-node job agree on it: see
    ``decision_file``)."""
    decision_file: str = ""
    """A node-local file where the launcher writes the run directory and run id once the
    launchers of the job agreed on them (several nodes); the worker waits for it before it
    writes anything ("" : ``run_dir`` and ``run_id`` are final)."""
    retain_s: float = 0.0
    """Each rank's segments older than this are deleted (s; 0: no age bound)."""
    max_disk_bytes: int = 1 << 30
    """Each rank's files are kept under this size by deleting its oldest segments (0: none)."""
    launcher_pid: int = 0
    """The ``meshprof run`` launcher's pid: a worker whose launcher is gone ends itself (0: no
    such check)."""
    slo: str = ""
    """Service levels of a serving job as given (``--slo``; "" none)."""

    def to_env(self) -> str:
        """The value of :data:`WORKER_ENV`."""
        return json.dumps(to_json(self))

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerSettings | None:
        """The settings in ``env`` (None when :data:`WORKER_ENV` is unset);
        :class:`~meshprof.records.codec.RecordError` (or ``ValueError`` for text that is not
        JSON) names what is wrong."""
        text = env.get(WORKER_ENV)
        if not text:
            return None
        return from_json(cls, json.loads(text), WORKER_ENV)


__all__ = ["WORKER_ENV", "WorkerSettings"]
