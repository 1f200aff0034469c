"""Imported by the fork server of :func:`meshprof.launch.spawn.run_ranks` before it forks any
rank: torch's parallel modules (:data:`PARALLEL`), which every rank that builds DDP, an FSDP2 or
DTensor model or a pipeline stage would otherwise import itself (dynamo, sympy and DTensor come
with them: ~900 modules, ~1.0 CPU s a rank on a 2-core x86 VM with torch 2.13).

Each import that fails, for any reason (a torch without one of them, a broken optional
dependency), is skipped: the server must start whatever this finds, and a rank that needs a
module that failed here fails on its own import, with its own error. Importing them starts no
thread."""

from __future__ import annotations

import contextlib
import importlib

PARALLEL = (
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed.pipelining",
)
"""The modules imported, in this order."""


def preload() -> tuple[str, ...]:
    """Import :data:`PARALLEL`, skipping any that fails; returns those imported."""
    done = []
    for name in PARALLEL:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
            done.append(name)
    return tuple(done)


preload()
