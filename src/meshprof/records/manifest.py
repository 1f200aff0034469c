"""``manifest.json``: the job level of a run directory, written by the launchers (or rank 0 of
the decorator and the demo); with several nodes each launcher rewrites it merged with every
node's record (:mod:`meshprof.rundir.manifest`).

Times are integers in ns since the epoch (``*_ns``) unless a name says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshprof.records.json_record import JsonRecord
from meshprof.records.members import check_world
from meshprof.records.rank_meta import Target

RUN_FORMAT = "meshprof-run/1"
"""The ``format`` of manifest.json."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings(JsonRecord):
    """The recording settings ``meshprof run`` was given."""

    flush_interval_s: float | None = None
    """Seconds between two periodic writes of each rank file."""
    hang_timeout_s: float | None = None
    """Seconds a collective may stay in flight before the watchdog dumps (0: off)."""
    hang_action: str | None = None
    """``"kill"`` or ``"wait"``."""
    step_detect: str | None = None
    """auto, optimizer, forward or off."""
    max_events: int | None = None
    """Ring-buffer capacity of each rank's recorder (None: its default)."""
    retain_s: float | None = None
    """Each rank's segments older than this are deleted (s; 0: no age bound)."""
    max_disk_bytes: int | None = None
    """Each rank's files are kept under this size by deleting its oldest segments (0: none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSummary(JsonRecord):
    """One node (launcher) of the job, as the merged manifest summarizes it."""

    node_id: str | None = None
    """The launcher's id (host and pid)."""
    node_rank: int | None = None
    """Its node rank."""
    host: str | None = None
    """Its host name."""
    ranks: list[int] | None = None
    """The global ranks that ran on it."""
    status: str | None = None
    """hang, failed, running or ok."""
    exit_code: int | None = None
    """Its ``meshprof run`` exit code."""
    torchrun_exit_code: int | None = None
    """Its torchrun's exit code."""
    start_ns: int | None = None
    """When it started."""
    end_ns: int | None = None
    """When it ended (None while it runs)."""
    heartbeat_ns: int | None = None
    """When its launcher last said it was alive (refreshed every ``heartbeat_s`` while the job
    runs): a node "running" without a heartbeat for several intervals is "stale" (its launcher
    was killed)."""
    heartbeat_s: float | None = None
    """Seconds between two heartbeats."""
    cause_ns: int | None = None
    """When the failure that decided its exit code happened (a rank's own failure, not
    torchrun's ending of the others): the job's code is that of the node whose cause came
    first."""

    def __post_init__(self) -> None:
        """The node rank a file claims is checked when it is read (-1: unknown)."""
        check_world(self.node_rank, "node's node_rank")


@dataclass(frozen=True, slots=True, kw_only=True)
class HangInfo(JsonRecord):
    """What the launcher saw of a hang."""

    first_dump: str | None = None
    """The first watchdog dump's file name."""
    dumps: list[str] | None = None
    """Every dump's file name."""
    signalled: list[int] | None = None
    """PIDs of the local workers asked to dump too (SIGUSR1)."""
    killed: bool | None = None
    """Whether the launcher ended the job (``--hang-action kill``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest(JsonRecord):
    """``manifest.json``: what ran, where, with which settings, and how it ended (job level)."""

    format: str | None = None
    """``"meshprof-run/1"``."""
    source: str | None = None
    """Who wrote the run directory when not ``meshprof run`` ("performance_monitor", "demo")."""
    run_id: str | None = None
    """The run's id, agreed by the launchers of the job through its rendezvous: directories
    (or rank data) of another run are never mixed with this one."""
    command: list[str] | str | None = None
    """The command line as typed (a string for synthetic runs)."""
    torchrun_command: list[str] | None = None
    """The torchrun command the launcher ran."""
    target: Target | None = None
    """The script or module."""
    world_size: int | None = None
    """Ranks expected."""
    nnodes: str | int | None = None
    """Nodes, as given (``"2"`` or ``"1:4"``)."""
    nproc_per_node: int | str | None = None
    """Workers per node, as given (a count, or torchrun's ``gpu``, ``cpu``, ``auto``)."""
    node_rank: int | None = None
    """The writing launcher's node rank."""
    hosts: list[str] | None = None
    """Host names of every node seen so far."""
    launcher_host: str | None = None
    """The writing launcher's host."""
    cwd: str | None = None
    """Its working directory."""
    versions: dict[str, Any] | None = None
    """``meshprof version --json`` of the job's torchrun process, the workers' environment
    (library versions and the recorder: free form, as each library reports itself)."""
    layout: dict[str, int] | None = None
    """The dp/tp/pp layout as given."""
    settings: RunSettings | None = None
    """The recording settings of ``meshprof run``."""
    config: dict[str, Any] | None = None
    """A recorder's ``ProfilerConfig.to_dict()`` (the demo and ``@performance_monitor``)."""
    start_ns: int | None = None
    """When the first launcher started."""
    start_time: str | None = None
    """The same, as local ISO time."""
    end_ns: int | None = None
    """When the last launcher ended (None while one runs)."""
    end_time: str | None = None
    """The same, as local ISO time."""
    exit_code: int | None = None
    """The code ``meshprof run`` exited with (the first failing node's)."""
    status: str | None = None
    """Worst node's: "hang", "failed", "stale" (a launcher stopped saying it was alive without
    finishing: killed), "running" or "ok"."""
    nodes: list[NodeSummary] | None = None
    """One summary per node (launcher), by node rank."""
    nodes_missing: int | None = None
    """Nodes of the job (``nnodes``) whose records were not in the directories read: their
    ranks are on those nodes' own disks (absent: none missing)."""
    rank_exit_codes: dict[str, int | None] | None = None
    """Global rank (as a string) -> its exit code; negative: it died of that signal (-9:
    SIGKILL), as torchrun reports it."""
    rank_signals: dict[str, str] | None = None
    """Global rank -> the signal it died of ("SIGKILL", "SIGTERM", ...), for signal deaths."""
    torchrun_exit_code: int | None = None
    """torchrun's own exit code (the first failing node's)."""
    missing_ranks: dict[str, str] | None = None
    """Global rank -> why its file is missing."""
    hang: HangInfo | None = None
    """The launcher's account of a hang (the dumps, who was signalled, whether it killed the
    job); the diagnosis itself is ``meshprof hang``'s."""

    def __post_init__(self) -> None:
        """The counts of ranks and nodes a manifest claims are checked when it is read (a
        manifest of world size 1e308 is damaged, not a job of that size)."""
        check_world(self.world_size, "manifest.world_size")
        check_world(self.node_rank, "manifest.node_rank")
        check_world(self.nodes_missing, "manifest.nodes_missing")
        for key, value in (("nnodes", self.nnodes), ("nproc_per_node", self.nproc_per_node)):
            if isinstance(value, int):
                check_world(value, f"manifest.{key}")


__all__ = ["RUN_FORMAT", "HangInfo", "Manifest", "NodeSummary", "RunSettings"]
