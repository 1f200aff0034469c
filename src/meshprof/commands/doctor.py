"""``meshprof doctor``: check a distributed setup, each check with ✓ or ✗ and the reason."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import asdict
from typing import Any

from meshprof.commands import arguments
from meshprof.errors import MeshprofError
from meshprof.launch.spawn import under_torchrun
from meshprof.render.doctor import render_checks
from meshprof.tools.doctor import Check, DoctorConfig, doctor_rank, merge, read_results


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="check process groups, connectivity, collectives, clocks, memory and load balance",
        description="Run health checks on every rank (under torchrun: the job's ranks; else --nproc "
        "local ranks). Exit code 1 on any ✗. Bounded by timeouts: a dead peer gives ✗, not a hang.",
    )
    arguments.add_rank_options(p)
    p.add_argument(
        "--timeout", type=float, default=10.0, help="per-check timeout in seconds (default 10)"
    )
    arguments.add_json_option(p, "the checks")
    p.set_defaults(func=run)


def run_local(
    nproc: int, cfg: DoctorConfig, worker: Any = doctor_rank, overall_timeout: float | None = None
) -> list[Check]:
    """Start ``nproc`` local ranks running ``worker`` and merge what they reported."""
    from meshprof.launch.spawn import WorkerError, run_ranks

    failures: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="meshprof-doctor-") as d:
        cfg = DoctorConfig(**{**asdict(cfg), "result_dir": d})
        limit = overall_timeout if overall_timeout is not None else cfg.timeout_s * 12 + 30
        try:
            run_ranks(worker, nproc, args=(cfg,), backend=None, timeout=limit)
        except TimeoutError as e:
            failures[-1] = f"the job did not finish within {limit:.0f} s: {e}"
        except WorkerError as e:
            failures[-1] = str(e).splitlines()[0]
        per_rank = read_results(d, nproc)
    checks = merge(
        per_rank,
        nproc,
        {r: failures[-1] for r in range(nproc) if r not in per_rank} if failures else {},
    )
    if failures and all(r in per_rank for r in range(nproc)):
        checks.append(Check("ranks", False, failures[-1]))
    return checks


def run(args: argparse.Namespace) -> int:
    backend = arguments.backend_of(args)
    if args.timeout <= 0:
        raise MeshprofError(f"--timeout {args.timeout}: must be > 0 seconds")
    cfg = DoctorConfig(backend=backend, timeout_s=args.timeout)
    if args.nproc is None and under_torchrun():
        rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        checks = doctor_rank(rank, ws, cfg)
        if rank != 0:
            return 1 if any(not c.ok for c in checks) else 0
    else:
        checks = run_local(arguments.local_nproc(args), cfg)
    if args.json:
        print(
            json.dumps(
                {"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks]},
                default=str,
            )
        )
    else:
        print(render_checks(checks))
    return 0 if all(c.ok for c in checks) else 1
