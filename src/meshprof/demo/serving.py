"""The serving demo: the demo transformer served with tensor parallelism to a client in another
process, under the recorder, the step monitor and the request monitor.

Rank 0 is the driver. A frontend process (:mod:`.serving_frontend`) reads each request from the
client the moment it comes and passes it on with its arrival time; a receiver thread of the
driver begins it (``RequestMonitor.begin``) and queues it; the serving loop schedules
(new requests first: one prefill step for all of them, else one decode step for every running
request: continuous batching at the decode step), broadcasts the plan to the other ranks, runs
the forward inside a step span named ``prefill`` or ``decode`` on every rank, records the
tokens it emitted (``RequestMonitor.tokens``) and streams them to the client. A request ends at
its own output length (``length``) or at the stop token (``stop``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.parallel.model_config import ModelConfig
from meshprof.records.serving import ServiceLevels

STOP_TOKEN = 0
"""The token that ends a request (reason ``stop``)."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """The serving demo's settings (the client's are its own, :mod:`.serving_client`)."""

    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(d_model=128, n_heads=4, vocab_size=256, seq_len=128)
    )
    """The transformer's sizes (``seq_len``: the longest prompt plus output)."""
    layers: int = 2
    """Transformer blocks."""
    seed: int = 0
    """Seed of the weights."""
    address: tuple[str, int] = ("127.0.0.1", 0)
    """The frontend's address for the driver rank (:mod:`.serving_frontend`)."""
    authkey: bytes = b"meshprof-serve"
    """The connection's key (``multiprocessing.connection``)."""
    max_batch: int = 16
    """Requests running at once at most."""
    slow_rank: int = -1
    """A rank made slow in its decode compute (-1: none)."""
    slow_ms: float = 0.0
    """How much slower, per decode step (ms)."""
    slow_from: int = 0
    """From this step number on."""
    device_ms: float = 0.0
    """Milliseconds every forward sleeps, on every rank (the time a GPU would compute while the
    host waits: the CPU stays free for the client and the other processes of a small
    machine)."""
    live_interval_s: float = 1.0
    """Seconds between two live records (0: none)."""
    slo: ServiceLevels | None = None
    """Service levels of the live goodput and SLO attainment."""
    nice: int = 0
    """Added to the ranks' nice value (Linux): above 0 on a machine with fewer cores than busy
    processes, the frontend and the client (which only wait and relay) get a core the moment a
    request or a token reaches them, as on a GPU server whose host threads are mostly idle."""
    accept_timeout_s: float = 60.0
    """Seconds rank 0 tries to reach the frontend."""

    def __post_init__(self) -> None:
        if self.layers < 1 or self.max_batch < 1:
            raise MeshprofError("serving demo: layers and max_batch must be at least 1")
        if self.slow_ms < 0:
            raise MeshprofError(f"--slow-ms {self.slow_ms}: expected a time of 0 or more")


def serve_worker(rank: int, world_size: int, cfg: ServeConfig, out_dir: str) -> dict[str, Any]:
    """Serve as ``rank`` of ``world_size`` tensor-parallel ranks (the process group exists),
    recording into ``out_dir``; returns the rank's counts."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from meshprof.api import StepMonitor, get_profiler
    from meshprof.demo.serving_model import ServingModel
    from meshprof.session.recording import RecordingSession, SessionConfig

    if cfg.nice > 0:
        with contextlib.suppress(OSError):
            os.nice(cfg.nice)  # (before any thread starts: they inherit it)
    layout = {"dp": 1, "tp": world_size, "pp": 1}
    session = RecordingSession(
        SessionConfig(
            run_dir=Path(out_dir),
            rank=rank,
            flush_interval_s=0,
            monitor=False,
            layout=layout,
            live_interval_s=cfg.live_interval_s,
            slo=cfg.slo,
        )
    ).start()
    prof = get_profiler()
    if session.prof is None or prof is None:
        raise MeshprofError(f"rank {rank}: the recorder did not start: {session.failures}")
    mon = StepMonitor(layout, profiler=prof, rank=rank)
    session.attach_monitor(mon)
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    model = ServingModel(cfg.model, cfg.layers, cfg.seed, mesh)
    model.device_s = cfg.device_ms / 1e3
    group = mesh.get_group()
    t0 = time.perf_counter()
    if rank == 0:
        counts = _drive(cfg, model, mon, group, dist)
    else:
        counts = _follow(cfg, model, mon, group, dist, rank)
    serve_s = time.perf_counter() - t0
    session.stop()
    return {"rank": rank, "serve_s": serve_s, **counts}


def _execute(model: Any, plan: dict[str, Any], slow: bool) -> list[int]:
    """Run the plan's forward; the next token of each of its requests."""
    if plan["kind"] == "prefill":
        return [model.prefill(rid, p) for rid, p in zip(plan["ids"], plan["prompts"], strict=True)]
    model.slow_s = plan["slow_s"] if slow else 0.0
    return list(model.decode(plan["ids"], plan["last"], plan["positions"]))


def _follow(
    cfg: ServeConfig, model: Any, mon: Any, group: Any, dist: Any, rank: int
) -> dict[str, Any]:
    steps = 0
    while True:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=group)
        plan = box[0]
        if plan is None:
            break
        with mon.step(name=plan["kind"]):
            _execute(model, plan, slow=rank == cfg.slow_rank and plan["step"] >= cfg.slow_from)
        for rid in plan.get("finished", ()):
            model.drop(rid)
        steps += 1
    return {"steps": steps}


@dataclass(slots=True)
class _Running:
    prompt: list[int]
    max_tokens: int
    out: list[int] = field(default_factory=list)


def _drive(cfg: ServeConfig, model: Any, mon: Any, group: Any, dist: Any) -> dict[str, Any]:
    from meshprof.demo.serving_client import connect
    from meshprof.monitor.request_monitor import requests

    rm = requests()
    try:
        conn = connect(cfg.address, cfg.authkey, cfg.accept_timeout_s)
    except OSError as e:
        dist.broadcast_object_list([None], src=0, group=group)
        raise MeshprofError(f"serving demo: no frontend at {cfg.address} ({e})") from None
    inbox: queue.Queue[tuple[int, list[int], int]] = queue.Queue()
    done = threading.Event()

    def receive() -> None:
        try:
            while True:
                msg = conn.recv()
                if msg[0] == "request":
                    _, rid, prompt, max_tokens, arrival_ns = msg
                    rm.begin(len(prompt), request_id=rid, arrival_ns=arrival_ns)
                    inbox.put((rid, list(prompt), int(max_tokens)))
                elif msg[0] == "done":
                    break
        except (EOFError, OSError):
            pass
        finally:
            done.set()

    threading.Thread(target=receive, name="serve-receive", daemon=True).start()
    running: dict[int, _Running] = {}
    finished: list[int] = []
    steps = served = 0
    while True:
        new: list[tuple[int, list[int], int]] = []
        while len(running) + len(new) < cfg.max_batch:
            try:
                new.append(inbox.get_nowait())
            except queue.Empty:
                break
        if not new and not running:
            if done.is_set() and inbox.empty():
                break
            try:
                new.append(inbox.get(timeout=0.05))
            except queue.Empty:
                continue
        step = mon.current_step
        if new:
            for rid, _, _ in new:
                rm.scheduled(rid)
            plan: dict[str, Any] = {
                "kind": "prefill",
                "step": step,
                "ids": [r for r, _, _ in new],
                "prompts": [p for _, p, _ in new],
            }
            for rid, p, m in new:
                running[rid] = _Running(p, m)
        else:
            ids = list(running)
            plan = {
                "kind": "decode",
                "step": step,
                "ids": ids,
                "last": [running[r].out[-1] for r in ids],
                "positions": [len(running[r].prompt) + len(running[r].out) - 1 for r in ids],
                "slow_s": cfg.slow_ms / 1e3,
            }
        plan["finished"] = finished
        dist.broadcast_object_list([plan], src=0, group=group)
        for rid in finished:
            model.drop(rid)
        finished = []
        with mon.step(name=plan["kind"]):
            tokens = _execute(model, plan, slow=cfg.slow_rank == 0 and step >= cfg.slow_from)
            rm.tokens(plan["ids"])
        out = []
        for rid, tok in zip(plan["ids"], tokens, strict=True):
            r = running[rid]
            r.out.append(tok)
            reason = ""
            if tok == STOP_TOKEN:
                reason = "stop"
            elif len(r.out) >= r.max_tokens:
                reason = "length"
            if reason:
                rm.finish(rid, reason)
                del running[rid]
                finished.append(rid)
                served += 1
            out.append((rid, tok, reason))
        conn.send(("tokens", out))
        steps += 1
    dist.broadcast_object_list([None], src=0, group=group)
    with contextlib.suppress(OSError):
        conn.send(("close",))
    conn.close()
    return {"steps": steps, "requests": served}


__all__ = ["STOP_TOKEN", "ServeConfig", "serve_worker"]
