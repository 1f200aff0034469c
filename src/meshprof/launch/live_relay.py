"""A job-wide live view without a shared file system, through the job's own rendezvous store.

Each rank publishes its live record into its node's run directory (``live/``). With node-local
directories each node would see only its own ranks; so every launcher relays: once a second it
puts its node's records under one key of the rendezvous store torchrun already runs (the c10d
TCPStore the agreement on the run id uses, :mod:`meshprof.launch.agreement`), and a launcher
that mirrors copies the other nodes' records into its own ``live/`` folder. Everything that
reads the live state there — the alert rules of node 0's launcher, ``meshprof top`` and
``meshprof serve``, the Prometheus exporter — then sees every rank of the job: a straggler on
node 1 alerts on node 0. No new transport: one key per node in a store every node already uses.

Which launchers mirror: all of them up to :data:`MIRROR_ALL_UP_TO` nodes, node 0 only beyond
(every node reading every other's records grows with the square of the nodes). Nodes whose
node record is in the local run directory (a shared file system) are not copied: their ranks
write there themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from meshprof.records.live import RankLive
from meshprof.rundir.live import read_rank_lives, write_rank_live
from meshprof.rundir.schema import node_record_path

PREFIX = "meshprof/live/"
COUNT_KEY = PREFIX + "nodes"
MIRROR_ALL_UP_TO = 16
"""Jobs of up to this many nodes mirror on every node; larger ones on node 0 only."""


def mirrors(node_rank: int, nnodes: str) -> bool:
    """Whether the launcher of node ``node_rank`` copies the other nodes' records."""
    n = int(nnodes.split(":")[-1]) if nnodes.split(":")[-1].isdigit() else MIRROR_ALL_UP_TO + 1
    return node_rank == 0 or n <= MIRROR_ALL_UP_TO


class LiveRelay:
    """Publishes this node's live records to the store and (``mirror``) copies the others'
    into ``run_dir/live``, every ``interval_s`` seconds, on a daemon thread. Never raises: a
    store that goes away (the job ends) stops the relay."""

    def __init__(
        self,
        endpoint: tuple[str, int],
        run_dir: Path,
        node_id: str,
        mirror: bool,
        interval_s: float = 1.0,
    ) -> None:
        self.endpoint = endpoint
        self.run_dir = run_dir
        self.node_id = node_id
        self.mirror = mirror
        self.interval_s = max(float(interval_s), 0.2)
        self.published = 0
        self.mirrored = 0
        """Records of other nodes written into the local live folder so far."""
        self.error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._present: set[str] = set()  # keys known to be set (a node's key stays)

    def start(self) -> LiveRelay:
        self._thread = threading.Thread(target=self._run, name="meshprof-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _connect(self) -> Any:
        from torch.distributed import TCPStore

        host, port = self.endpoint
        with socket.create_connection((host, port), timeout=1.0):
            pass
        return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))

    def _run(self) -> None:
        store = None
        slot = -1
        while not self._stop.wait(self.interval_s):
            try:
                if store is None:
                    store = self._connect()
                    slot = int(store.add(COUNT_KEY, 1)) - 1
                self.step(store, slot)
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
                if self.published:
                    return  # the store is gone: the job ended
                store = None

    def step(self, store: Any, slot: int) -> None:
        """One relay: publish this node's records under ``slot``, mirror the others'."""
        mine = [
            r.to_dict() for r in read_rank_lives(self.run_dir).values() if r.node_id == self.node_id
        ]
        store.set(f"{PREFIX}{slot}", json.dumps({"node_id": self.node_id, "records": mine}))
        self.published += 1
        if not self.mirror:
            return
        n = int(store.add(COUNT_KEY, 0))
        for key in (f"{PREFIX}{i}" for i in range(n) if i != slot):
            if key not in self._present and store.check([key]):
                self._present.add(key)  # (a node counted but not published yet is skipped)
        keys = sorted(self._present)
        if keys:
            for raw in store.multi_get(keys):
                self._mirror(raw)

    def _mirror(self, raw: bytes) -> None:
        try:
            got = json.loads(raw)
        except ValueError:
            return
        node = str(got.get("node_id") or "") if isinstance(got, dict) else ""
        if not node or node == self.node_id or node_record_path(self.run_dir, node).exists():
            return  # ours, or a node writing into this directory itself (shared file system)
        for d in got.get("records") or []:
            with contextlib.suppress(Exception):
                rec = RankLive.from_dict(d)
                if rec.node_id == node:
                    write_rank_live(self.run_dir, rec)
                    self.mirrored += 1


def relay_interval(live_interval_s: float) -> float:
    """The relay's period: the ranks' own (``--live-interval``), at least a second, or
    ``MESHPROF_RELAY_S``."""
    try:
        return float(os.environ.get("MESHPROF_RELAY_S", "") or max(live_interval_s, 1.0))
    except ValueError:
        return max(live_interval_s, 1.0)


__all__ = ["COUNT_KEY", "MIRROR_ALL_UP_TO", "LiveRelay", "mirrors", "relay_interval"]
