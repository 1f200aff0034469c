"""Run the serving demo: the tensor-parallel ranks (:mod:`.serving`), the frontend
(:mod:`.serving_frontend`) and the load-generating client (:mod:`.serving_client`), each
client-side part a process of its own, into one run directory.

The client's timestamps go to ``OUT/client.json``, beside the ranks' folders: the truth the
report's request figures are compared with (tests/test_serving_truth.py).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from meshprof.demo.serving import ServeConfig, serve_worker
from meshprof.demo.serving_client import Load
from meshprof.errors import MeshprofError

CLIENT_FILE = "client.json"
"""The client's timestamps, in the run directory."""


def run_serving(
    out: Path, cfg: ServeConfig, load: Load, tp: int = 2, timeout_s: float = 600.0
) -> list[dict[str, Any]]:
    """Serve ``load`` with ``tp`` ranks into ``out``; the ranks' counts."""
    from meshprof.commands.version import versions
    from meshprof.launch.spawn import run_ranks
    from meshprof.rundir import write_manifest

    out.mkdir(parents=True, exist_ok=True)
    front = [
        sys.executable, "-m", "meshprof.demo.serving_frontend",
        "--client", "127.0.0.1:0",
        "--engine", "127.0.0.1:0",
        "--authkey", cfg.authkey.decode(),
        "--timeout", str(timeout_s),
    ]  # fmt: skip
    # the frontend binds both ports itself and says which (ports picked here and bound later
    # were taken by parallel jobs: a client then met another demo's frontend)
    frontend = subprocess.Popen(front, env=dict(os.environ), stdout=subprocess.PIPE, text=True)
    assert frontend.stdout is not None
    line = frontend.stdout.readline().split()
    if len(line) != 3 or line[0] != "ports":
        frontend.kill()
        frontend.wait()
        raise MeshprofError("serving demo: the frontend did not start")
    port, engine = int(line[1]), int(line[2])
    cfg = dataclasses.replace(cfg, address=("127.0.0.1", engine))
    write_manifest(
        out,
        {
            "command": ["meshprof", *sys.argv[1:]] if "demo" in sys.argv else ["meshprof", "demo"],
            "world_size": tp,
            "hosts": [socket.gethostname()],
            "layout": {"dp": 1, "tp": tp, "pp": 1},
            "versions": versions(),
            "start_ns": time.time_ns(),
        },
    )
    cmd = [
        sys.executable, "-m", "meshprof.demo.serving_client",
        "--address", f"127.0.0.1:{port}",
        "--authkey", cfg.authkey.decode(),
        "--out", str(out / CLIENT_FILE),
        "--requests", str(load.requests),
        "--rate", str(load.rate),
        "--prompt", f"{load.prompt[0]}:{load.prompt[1]}",
        "--output", f"{load.output[0]}:{load.output[1]}",
        "--seed", str(load.seed),
        "--vocab", str(cfg.model.vocab_size),
        "--timeout", str(timeout_s),
    ]  # fmt: skip
    client = subprocess.Popen(cmd, env=dict(os.environ))
    try:
        results = run_ranks(
            serve_worker, tp, (cfg, str(out)), backend="gloo", timeout=timeout_s, parallel=True
        )  # (DTensor tensor parallelism: imported once by the fork server)
        try:
            code = client.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise MeshprofError("serving demo: the client did not finish") from None
        if code != 0:
            raise MeshprofError(f"serving demo: the client failed (exit code {code})")
    finally:
        for proc in (client, frontend):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return results


__all__ = ["CLIENT_FILE", "run_serving"]
