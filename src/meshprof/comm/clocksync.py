"""Collect clock-synchronization samples at start (runs inside the training process).

Every rank but the reference (rank 0) plays ``rounds`` rounds of ping-pong with rank 0 over the
default process group: it notes its own wall clock ``t_send`` (``time.time_ns``), sends a small
tensor, rank 0 notes its wall clock ``t_ref`` on receipt and sends it back, and the rank notes
``t_recv`` when the answer arrives. Each round gives one sample ``(t_send, t_ref, t_recv)``;
the analysis (:mod:`meshprof.analyze.run.events.clock`) picks the sample with the smallest round trip:
``offset = t_ref - (t_send + t_recv) / 2`` and the true offset lies within ``± RTT / 2`` of it.

The result goes into the rank file's ``meta["clock_sync"]``::

    {"method": "pg", "ref_rank": 0, "rank": r, "rounds": n,
     "samples": [[t_send_local, t_ref_rank0, t_recv_local], ...],   # ns, empty on rank 0
     "error": ""}                                                   # why it failed, if it did

This never raises: a failure is returned in ``error`` with whatever samples were taken.
The recorder (if enabled) is paused while the exchange runs, so the ping-pong messages are not
recorded as the user's point-to-point traffic.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any


def _device_for(dist: Any) -> Any:
    """CPU when the default group can move CPU tensors (gloo), else the current CUDA device."""
    import torch

    backend = str(dist.get_backend()).lower()
    if "gloo" in backend or "mpi" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def exchange_timestamps(rounds: int = 20) -> dict[str, Any]:
    """Run the timestamp exchange on every rank of the default process group (collective call:
    every rank must call it at the same point). Returns the ``clock_sync`` dict described in the
    module docstring; never raises."""
    out: dict[str, Any] = {
        "method": "pg",
        "ref_rank": 0,
        "rank": -1,
        "rounds": int(rounds),
        "samples": [],
        "error": "",
    }
    prof = None
    was_enabled = False
    try:
        import torch
        import torch.distributed as dist

        from meshprof.comm.active import get_profiler

        if not (dist.is_available() and dist.is_initialized()):
            out["error"] = "torch.distributed is not initialized"
            return out
        prof = get_profiler()
        if prof is not None and prof.config.enabled:
            was_enabled = True
            prof.update_config(enabled=False)
        rank, world = dist.get_rank(), dist.get_world_size()
        out["rank"] = rank
        dev = _device_for(dist)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        buf = torch.zeros(1, dtype=torch.int64, device=dev)
        if rank == 0:
            for peer in range(1, world):
                for _ in range(rounds):
                    dist.recv(buf, src=peer)
                    sync()
                    buf.fill_(time.time_ns())
                    dist.send(buf, dst=peer)
        else:
            samples: list[list[int]] = []
            for _ in range(rounds):
                t_send = time.time_ns()
                dist.send(buf, dst=0)
                dist.recv(buf, src=0)
                sync()
                t_recv = time.time_ns()
                samples.append([t_send, int(buf.item()), t_recv])
            out["samples"] = samples
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        if prof is not None and was_enabled:
            with contextlib.suppress(Exception):
                prof.update_config(enabled=True)
    return out
