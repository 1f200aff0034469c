"""Start N local ranks of a function in real process groups, with a hard timeout.

The local launcher of the CLI (``meshprof bench --nproc``, ``meshprof doctor --nproc``,
``meshprof demo``) and of the tests, benchmarks and examples: a run-time part of meshprof, not
test infrastructure, so it sits beside :mod:`meshprof.launch.launcher` (the torchrun wrapper).
Workers are started from a fork server that has already imported torch and meshprof's recorder
(:mod:`meshprof.api`: importing it starts no thread and installs no handler), and, for ranks
that build parallel models, torch's parallel modules (:data:`PARALLEL`), so a rank starts in a
fraction of a second (0.04 CPU s, against 0.2 s when each imported the recorder itself, and
~1 s more when each imported what DDP, FSDP, DTensor or pipelining pull in); a worker that
raises, dies or outlives the timeout fails the whole call (every worker is killed), so nothing
that uses it can hang.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

_CTX: Any = None

PRELOAD = ("torch", "torch.distributed", "numpy", "meshprof.api")
"""What the fork server imports once, before it forks the ranks: torch and meshprof's recorder."""

PARALLEL = "meshprof.launch.preload"
"""Imported too when the ranks build parallel models (``run_ranks(..., parallel=True)``, or
:data:`PARALLEL_BY_DEFAULT`): torch's parallel modules (:mod:`meshprof.launch.preload`).
Constructing DDP, an FSDP2 or DTensor model or a pipeline stage imports ~900 modules, ~1.0 CPU
s, in every rank that does it; imported by the server, they cost that once and every rank
inherits them. Ranks that only call collectives (``meshprof doctor``, ``bench``) would pay the
second for nothing."""

PARALLEL_BY_DEFAULT = False
"""``parallel`` of a :func:`run_ranks` call that does not say (the test suite sets it: most of
its ranks build parallel models)."""


def preload_modules(parallel: bool) -> list[str]:
    """What the fork server imports: :data:`PRELOAD`, and :data:`PARALLEL` for ``parallel``."""
    return [*PRELOAD, *([PARALLEL] if parallel else [])]


def _context(parallel: bool) -> Any:
    """The fork server's context; the first call of the process decides what it preloads."""
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(preload_modules(parallel))
        _CTX = ctx
    return _CTX


def under_torchrun() -> bool:
    """True inside a worker started by torchrun (or any launcher that sets the env:// variables)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WorkerError(RuntimeError):
    """A rank raised or died; the message carries its traceback."""


def _worker(
    rank: int,
    world_size: int,
    port: int,
    backend: str | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    env: dict[str, str],
    results: Any,
    pg_timeout_s: float,
) -> None:
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    try:
        import torch

        torch.set_num_threads(1)
        if backend is not None:
            import torch.distributed as dist

            dist.init_process_group(
                backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout_s)
            )
        try:
            out = fn(rank, world_size, *args)
        finally:
            if backend is not None:
                import torch.distributed as dist

                if dist.is_initialized():
                    with contextlib.suppress(Exception):
                        dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def _others(procs: list[Any], results: Any, failed: int) -> str:
    """What became of the other ranks when ``failed`` failed (their errors, or how they exited,
    within 2 s): a peer's "connection closed" usually hides the rank that died first."""
    deadline = time.monotonic() + 2.0
    lines = []
    seen = {failed}
    while time.monotonic() < deadline and len(seen) < len(procs):
        try:
            rank, ok, value = results.get(timeout=0.2)
        except queue.Empty:
            if all(p.exitcode is not None for r, p in enumerate(procs) if r not in seen):
                break
            continue
        seen.add(rank)
        if not ok:
            lines.append(f"rank {rank} failed too:\n{value}")
    for r, p in enumerate(procs):
        if r not in seen and p.exitcode is not None and p.exitcode != 0:
            lines.append(f"rank {r} exited with code {p.exitcode} and no result")
    return "".join("\n" + x for x in lines)


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    *,
    backend: str | None = "gloo",
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    pg_timeout_s: float = 60.0,
    parallel: bool | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes; return the results
    in rank order.

    With ``backend`` set, each worker joins a process group of that backend first (gloo on CPU)
    and leaves it after ``fn``. ``fn`` and its results must be picklable (a module-level function).
    Raises :class:`WorkerError` when a rank fails and :class:`TimeoutError` after ``timeout``
    seconds; every worker is gone when this returns or raises. ``parallel``: the ranks build
    parallel models (DDP, FSDP2, DTensor, pipelining), so the fork server imports those modules
    once (:data:`PARALLEL`; None: :data:`PARALLEL_BY_DEFAULT`). It is started by the first
    call of the process, which alone decides.
    """
    ctx = _context(PARALLEL_BY_DEFAULT if parallel is None else parallel)
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, port, backend, fn, args, dict(env or {}), results, pg_timeout_s),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"ranks {sorted(set(range(world_size)) - set(out))} did not finish within {timeout:.0f} s"
                )
            try:
                rank, ok, value = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in out]
                if dead:
                    # give a dying worker's message a moment to arrive
                    try:
                        rank, ok, value = results.get(timeout=2.0)
                    except queue.Empty:
                        raise WorkerError(
                            f"rank {dead[0]} exited with code {procs[dead[0]].exitcode} and no result"
                        ) from None
                else:
                    continue
            if not ok:
                raise WorkerError(f"rank {rank} failed:\n{value}{_others(procs, results, rank)}")
            out[rank] = value
        return [out[r] for r in range(world_size)]
    finally:
        for p in procs:
            p.join(timeout=5 if len(out) == world_size else 0.1)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
