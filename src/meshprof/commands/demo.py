"""``meshprof demo``: train the 3D-parallel demo transformer on local ranks under the recorder
and print what it recorded, per parallel dimension and per op, and the loss of every step."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from meshprof.commands.arguments import add_json_option
from meshprof.demo.worker import DTYPES, DemoConfig, demo_worker
from meshprof.errors import MeshprofError
from meshprof.parallel import args as layout_options
from meshprof.render.format import fmt_bytes, fmt_ns
from meshprof.rundir.atomic import atomic_write_text

#: dp × tp × pp when no degree is given: 4 ranks that show a DP and a PP dimension.
DEFAULT_LAYOUT = (2, 1, 2)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="train a small 3D-parallel transformer on local ranks, profiled"
    )
    p.add_argument(
        "-o", "--out", default="meshprof-demo", help="output directory (default ./meshprof-demo)"
    )
    p.add_argument("--steps", type=int, default=12, help="optimizer steps (default 12)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and tokens (default 0)")
    p.add_argument("--lr", type=float, default=1e-2, help="AdamW learning rate (default 0.01)")
    p.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="parameter dtype (default float32)"
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="cuda (NCCL) when enough GPUs exist, else cpu (gloo)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="give up after this many seconds (default 600)"
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="also print rank 0's collective tables, the per-dimension totals and its step analysis",
    )
    g = p.add_argument_group("serving (--serve)")
    g.add_argument(
        "--serve",
        action="store_true",
        help="serve the transformer instead: tensor parallel (--tp, default 2), a KV cache, a "
        "client sending requests as a Poisson stream; the report's Serving section",
    )
    g.add_argument("--requests", type=int, default=40, help="requests sent (default 40)")
    g.add_argument("--rate", type=float, default=10.0, help="requests per second (default 10)")
    g.add_argument(
        "--slo", metavar="NAME=TIME,...", help="service levels (e.g. ttft=500ms,tpot=100ms)"
    )
    g.add_argument(
        "--device-ms",
        type=float,
        default=10.0,
        help="milliseconds each forward waits, as for a GPU (default 10; 0: none)",
    )
    g.add_argument("--slow-rank", type=int, default=-1, help="make this rank slow in decode")
    g.add_argument("--slow-ms", type=float, default=0.0, help="... by this much per decode step")
    g.add_argument("--slow-from", type=int, default=0, help="... from this step on")
    add_json_option(p)
    layout_options.add_layout_args(p)
    layout_options.add_model_args(p)
    p.set_defaults(func=run)


def _device(choice: str, world_size: int) -> str:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if choice == "cuda" and n < world_size:
        raise MeshprofError(
            f"--device cuda needs {world_size} GPUs (one per rank), this machine has {n}"
        )
    if choice == "auto":
        return "cuda" if n >= world_size else "cpu"
    return choice


def _dimension_table(results: list[dict[str, Any]]) -> Table:
    t = Table(
        title="collectives during training, per parallel dimension (all ranks)",
        title_justify="left",
    )
    for name in ("dimension", "count", "bytes", "time (sum)", "time per rank"):
        t.add_column(name, justify="right" if name != "dimension" else "left")
    n = len(results)
    dims = sorted(
        {d for r in results for d in r["dimensions"]},
        key=lambda d: (("dp", "tp", "pp").index(d) if d in ("dp", "tp", "pp") else 3, d),
    )
    for dim in dims:
        rows = [r["dimensions"][dim] for r in results if dim in r["dimensions"]]
        count = sum(x["count"] for x in rows)
        if not count:
            continue
        nbytes = sum(x["bytes"] for x in rows)
        ns = sum(x["time_ns"] for x in rows)
        t.add_row(dim, str(count), fmt_bytes(nbytes), fmt_ns(ns), fmt_ns(ns / n))
    return t


def run(args: argparse.Namespace) -> int:
    if args.serve:
        return serve(args)
    from meshprof.launch.spawn import run_ranks

    parallel = layout_options.parallel_config_from_args(args, default=DEFAULT_LAYOUT)
    model = layout_options.model_config_from_args(args)
    device = _device(args.device, parallel.world_size)
    training = {k: getattr(args, k) for k in ("steps", "seed", "lr", "dtype")}
    cfg = DemoConfig(parallel=parallel, model=model, device=device, **training)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=args.json)
    console.print(
        f"[bold]meshprof demo[/]: dp={parallel.dp} × tp={parallel.tp} × pp={parallel.pp} = {parallel.world_size} ranks on {device} "
        f"({cfg.backend}), {parallel.num_layers} layers, {args.steps} steps → {out}"
    )
    import socket
    import sys

    from meshprof.commands.version import versions
    from meshprof.rundir import write_manifest

    write_manifest(
        out,
        {
            "command": ["meshprof", *sys.argv[1:]]
            if sys.argv and "demo" in sys.argv
            else ["meshprof", "demo"],
            "world_size": parallel.world_size,
            "hosts": [socket.gethostname()],
            "layout": {"dp": parallel.dp, "tp": parallel.tp, "pp": parallel.pp},
            "versions": versions(),
            "start_ns": time.time_ns(),
        },
    )
    t0 = time.perf_counter()
    results = run_ranks(
        demo_worker,
        parallel.world_size,
        (cfg, str(out)),
        backend=cfg.backend,
        timeout=args.timeout,
        pg_timeout_s=parallel.comm_timeout_s,
        parallel=True,  # DTensor, FSDP2, pipelining: imported once by the fork server
    )
    wall = time.perf_counter() - t0
    losses = results[0]["losses"]
    doc = {
        "config": {
            "parallel": parallel.to_dict(),
            "model": model.to_dict(),
            "steps": cfg.steps,
            "seed": cfg.seed,
            "lr": cfg.lr,
            "dtype": cfg.dtype,
            "device": device,
        },
        "losses": losses,
        "wall_s": wall,
        "ranks": [{k: v for k, v in r.items() if k != "summary"} for r in results],
        "files": sorted(p.name for p in out.glob("comm_rank*.json")),
    }
    atomic_write_text(out / "demo.json", json.dumps(doc, indent=1))
    if args.json:
        print(json.dumps(doc))
        return 0
    if args.full:
        print(results[0]["summary"], end="")
        console.print(_dimension_table(results))
        print(results[0]["analysis"], end="")
    console.print(
        "[bold]loss per step[/] (global batch, nats/token): " + " ".join(f"{x:.3f}" for x in losses)
    )
    train_s = max(r["train_s"] for r in results)
    console.print(
        f"trained in {train_s:.1f} s ({wall:.1f} s with start-up); per-rank recorder exports and demo.json in {out}/"
    )
    _report(out, console)
    return 0


def _report(out: Path, console: Console) -> None:
    """The cross-rank report of the demo's run directory: terminal summary, HTML and trace."""
    from meshprof.render.perfetto import build_trace, write_trace
    from meshprof.render.report_brief import print_brief
    from meshprof.report.analysis import analyze_run_parts
    from meshprof.rundir import load_run

    run_ = load_run(out)
    parts = analyze_run_parts(run_)
    rep = parts.report
    print_brief(rep, console)
    written = []
    try:
        from meshprof.render.html import write_html

        written.append(write_html(out / "report.html", rep))
    except ImportError as e:  # jinja2 missing: the html extra
        console.print(f"no HTML report ({e}); pip install 'meshprof[html]'")
    trace = build_trace(parts.run, parts.table, parts.clock, parts.match)
    written.append(write_trace(out / "trace.json", trace))
    console.print(
        "wrote " + ", ".join(str(w) for w in written) + f" — later: meshprof report {out}",
        highlight=False,
    )


def serve(args: argparse.Namespace) -> int:
    """``meshprof demo --serve``: the serving job, its client, then the report."""
    from meshprof.demo.serving import ServeConfig
    from meshprof.demo.serving_client import Load
    from meshprof.demo.serving_run import run_serving
    from meshprof.records.serving import ServiceLevels

    tp = args.tp or 2
    if (args.dp or 1) != 1 or (args.pp or 1) != 1 or tp < 1:
        raise MeshprofError("--serve: tensor parallelism only (--tp N; no --dp or --pp)")
    if args.requests < 1 or not args.rate > 0:
        raise MeshprofError("--serve: --requests must be at least 1 and --rate above 0")
    if args.slow_rank >= tp:
        raise MeshprofError(f"--slow-rank {args.slow_rank}: the job has ranks 0-{tp - 1}")
    slo = ServiceLevels.parse(args.slo) if args.slo else None
    model = layout_options.model_config_from_args(args)
    model = dataclasses.replace(model, seq_len=max(model.seq_len, 128))
    if model.n_heads % tp:
        raise MeshprofError(f"--tp {tp} must divide the attention heads ({model.n_heads})")
    cfg = ServeConfig(
        model=model,
        seed=args.seed,
        device_ms=args.device_ms,
        slow_rank=args.slow_rank,
        slow_ms=args.slow_ms,
        slow_from=args.slow_from,
        slo=slo,
    )
    load = Load(requests=args.requests, rate=args.rate, seed=args.seed, vocab=model.vocab_size)
    out = Path(args.out)
    console = Console(stderr=args.json)
    console.print(
        f"[bold]meshprof demo --serve[/]: tp={tp} ranks on cpu (gloo), {args.requests} requests "
        f"at {args.rate:g}/s (Poisson), a client in its own process → {out}"
    )
    t0 = time.perf_counter()
    results = run_serving(out, cfg, load, tp=tp, timeout_s=args.timeout)
    wall = time.perf_counter() - t0
    from meshprof.render.report_brief import print_brief
    from meshprof.report.analysis import analyze_run
    from meshprof.rundir import load_run

    rep = analyze_run(load_run(out), slo=slo)
    doc = {"ranks": results, "wall_s": wall}
    atomic_write_text(out / "demo.json", json.dumps(doc, indent=1))
    if args.json:
        print(json.dumps(doc))
        return 0
    print_brief(rep, console)
    try:
        from meshprof.render.html import write_html

        console.print(
            f"wrote {write_html(out / 'report.html', rep)} — later: meshprof report {out}"
        )
    except ImportError as e:
        console.print(f"no HTML report ({e}); pip install 'meshprof[html]'")
    return 0
