"""Command-line options that several ``meshprof`` subcommands share, and what they resolve to.

Not a subcommand itself (:data:`meshprof.cli.COMMANDS` does not list it): ``--json`` for every
command with machine-readable output, and ``--nproc`` / ``--backend`` for the commands that run
collectives on ranks of their own (``bench``, ``doctor``) when they are not under torchrun.
"""

from __future__ import annotations

import argparse
from typing import Any

from meshprof.errors import MeshprofError

DEFAULT_NPROC = 2
"""Local ranks a rank-running command starts outside torchrun when ``--nproc`` is not given."""


def add_json_option(p: argparse.ArgumentParser, what: str = "the result") -> None:
    """``--json``: print ``what`` as JSON instead of text."""
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def add_rank_options(p: argparse.ArgumentParser) -> None:
    """``--nproc`` (local ranks to start) and ``--backend`` (of the default process group)."""
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        help=f"start this many local ranks (default {DEFAULT_NPROC} outside torchrun)",
    )
    p.add_argument(
        "--backend", default=None, help="gloo or nccl (default: nccl with CUDA, else gloo)"
    )


def backend_of(args: argparse.Namespace) -> str:
    """``--backend``, else nccl when CUDA is available with a GPU for every local rank (NCCL
    refuses two ranks on one GPU), else gloo. Raises :class:`MeshprofError` for ``--backend
    nccl`` with more local ranks than GPUs."""
    import os

    import torch

    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or local_nproc(args)
    except ValueError:
        local = local_nproc(args)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.backend:
        if args.backend == "nccl" and local > gpus:
            raise MeshprofError(
                f"--backend nccl needs one GPU per local rank: {local} rank(s), {gpus} GPU(s) "
                "(use --backend gloo or fewer ranks)"
            )
        return str(args.backend)
    return "nccl" if 0 < local <= gpus else "gloo"


def local_nproc(args: argparse.Namespace) -> int:
    """The number of local ranks to start (``--nproc``, else :data:`DEFAULT_NPROC`); raises
    :class:`MeshprofError` below 1."""
    nproc = DEFAULT_NPROC if args.nproc is None else int(args.nproc)
    if nproc < 1:
        raise MeshprofError(f"--nproc {nproc}: need at least 1 rank")
    return nproc


def option_number(value: str, option: str, kind: type = float) -> Any:
    """An option's text as a ``kind`` (float, int); a :class:`MeshprofError` naming ``option``
    (``--alert-interval 'x': expected a number``) when it is not one."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise MeshprofError(f"{option} {value!r}: expected a number") from None


__all__ = [
    "DEFAULT_NPROC",
    "add_json_option",
    "add_rank_options",
    "backend_of",
    "local_nproc",
    "option_number",
]
