"""``meshprof bench``: collective bandwidth like nccl-tests (under torchrun or ``--nproc N``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from meshprof.commands import arguments
from meshprof.launch.spawn import under_torchrun
from meshprof.render.bench import plot_svg, render_table, to_csv
from meshprof.rundir.atomic import atomic_write_text
from meshprof.tools.bench import (
    ALL_OPS,
    DTYPES,
    BenchConfig,
    BenchResult,
    parse_size,
    run_bench_rank,
    size_list,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure collective bandwidth like nccl-tests",
        description="Time collectives per op and size (busbw/algbw as nccl-tests defines them), check "
        "their results, and print a table. Runs under torchrun (uses the job's ranks) or starts "
        "--nproc local ranks itself (gloo on CPU, NCCL on CUDA).",
    )
    arguments.add_rank_options(p)
    p.add_argument(
        "--ops", default="all", help=f"comma-separated ops or 'all': {','.join(ALL_OPS)}"
    )
    p.add_argument(
        "-b", "--minbytes", default="1K", help="smallest size (K/M/G suffixes), default 1K"
    )
    p.add_argument("-e", "--maxbytes", default="16M", help="largest size, default 16M")
    p.add_argument(
        "-f", "--stepfactor", type=float, default=4.0, help="size multiplication factor, default 4"
    )
    p.add_argument("-d", "--dtype", default="float32", choices=DTYPES)
    p.add_argument("-w", "--warmup", type=int, default=5, help="warm-up iterations per size")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("--mode", choices=["both", "out-of-place", "in-place"], default="both")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    arguments.add_json_option(p, "the results")
    p.add_argument("--csv", metavar="PATH", help="also write the rows as CSV")
    p.add_argument("--plot", metavar="PATH.svg", help="also write busbw against size as an SVG")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="give up after this many seconds (with --nproc)",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    ops = (
        ALL_OPS
        if args.ops.strip() == "all"
        else tuple(o.strip() for o in args.ops.split(",") if o.strip())
    )
    ops = tuple("sendrecv" if o in ("send", "recv", "send_recv", "send/recv") else o for o in ops)
    sizes = size_list(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    modes = ("out-of-place", "in-place") if args.mode == "both" else (args.mode,)
    return BenchConfig(
        ops=ops,
        sizes=tuple(sizes),
        dtype=args.dtype,
        warmup=args.warmup,
        iters=args.iters,
        check=not args.no_check,
        modes=modes,
    )


def _worker(rank: int, world_size: int, config: BenchConfig) -> BenchResult | None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    return run_bench_rank(rank, world_size, config)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    backend = arguments.backend_of(args)
    if args.nproc is None and under_torchrun():
        import torch
        import torch.distributed as dist

        started_here = not dist.is_initialized()
        if started_here:
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend)
        try:
            result = run_bench_rank(dist.get_rank(), dist.get_world_size(), config)
        finally:
            if started_here:  # leave together: a rank exiting early aborts the others' gloo pairs
                dist.barrier()
                dist.destroy_process_group()
        if result is None:
            return 0
    else:
        from meshprof.launch.spawn import WorkerError, run_ranks

        nproc = arguments.local_nproc(args)
        try:
            result = run_ranks(
                _worker, nproc, args=(config,), backend=backend, timeout=args.timeout
            )[0]
        except (WorkerError, TimeoutError) as e:
            print(f"meshprof bench: {e}", file=sys.stderr)
            return 1
    return _emit(result, args)


def _emit(result: BenchResult, args: argparse.Namespace) -> int:
    if args.csv:
        atomic_write_text(Path(args.csv), to_csv(result))
    if args.plot:
        atomic_write_text(Path(args.plot), plot_svg(result))
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print(render_table(result))
    return 1 if any(r.wrong > 0 for r in result.rows) else 0
