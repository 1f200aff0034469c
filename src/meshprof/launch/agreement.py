"""The launchers of one multi-node job agree on one run through the job's own rendezvous.

torchrun's rendezvous already has a store every node reaches (the c10d TCPStore at
``--master-addr:--master-port`` for a static rendezvous, at ``--rdzv-endpoint`` for the c10d
backend). Once it is up, each launcher proposes its run (id and directory name) with one
``compare_set`` on a meshprof key: the first proposal is set, every launcher reads it back, so all
of them (and, through each launcher, its workers) use the same run id and the same directory
name. Nothing of meshprof's own listens or connects elsewhere. A job whose store meshprof cannot
reach (the etcd backend) keeps each launcher's own proposal.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from datetime import timedelta
from typing import Any

KEY = "meshprof/run"
"""The store key the launchers agree on."""
DEFAULT_C10D_PORT = 29400


def store_endpoint(torchrun: dict[str, str]) -> tuple[str, int] | None:
    """(host, port) of the job's rendezvous store from torchrun's options; None when meshprof
    cannot use it (etcd, or nothing given)."""
    backend = torchrun.get("rdzv-backend", "")
    endpoint = torchrun.get("rdzv-endpoint", "")
    if endpoint and backend in ("", "c10d", "static"):
        host, _, port = endpoint.rpartition(":")
        if not host:
            host, port = endpoint, ""
        return host.strip("[]"), int(port) if port.isdigit() else DEFAULT_C10D_PORT
    if backend in ("", "static") and torchrun.get("master-addr") and torchrun.get("master-port"):
        port = torchrun["master-port"]
        return torchrun["master-addr"], int(port) if port.isdigit() else 29500
    return None


class Agreement:
    """Proposes ``proposal`` on a thread until the store answers; :attr:`result` is the agreed
    run (the first launcher's proposal), None until then."""

    def __init__(self, endpoint: tuple[str, int] | None, proposal: dict[str, Any]) -> None:
        self.endpoint = endpoint
        self.proposal = proposal
        self.result: dict[str, Any] | None = None if endpoint is not None else dict(proposal)
        self.error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Agreement:
        if self.result is None:
            self._thread = threading.Thread(target=self._run, name="meshprof-agree", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        assert self.endpoint is not None
        host, port = self.endpoint
        while not self._stop.is_set():
            try:
                # a plain connect first: the store's client logs every refused attempt
                with socket.create_connection((host, port), timeout=1.0):
                    pass
                self.result = _propose(host, port, self.proposal)
                return
            except Exception as e:
                self.error = f"{type(e).__name__}: {e}"
                self._stop.wait(0.2)


def _propose(host: str, port: int, proposal: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed import TCPStore

    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    got = store.compare_set(KEY, "", json.dumps(proposal))
    agreed = json.loads(got)
    if not isinstance(agreed, dict) or not agreed.get("run_id"):
        raise ValueError(f"unexpected value under {KEY}: {got!r:.80}")
    with contextlib.suppress(Exception):
        del store
    return agreed


def wait_for(agreement: Agreement, alive: Any, timeout_s: float) -> dict[str, Any] | None:
    """The agreed run, waiting while ``alive()`` and at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while agreement.result is None and alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return agreement.result


__all__ = ["KEY", "Agreement", "store_endpoint", "wait_for"]
