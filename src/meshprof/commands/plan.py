"""``meshprof plan --dp 2 --tp 2 --pp 2 --layers 24``: the rank table, the process groups and
the per-device memory estimate of a 3D-parallel layout, without starting anything."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from meshprof.parallel.args import (
    add_layout_args,
    add_model_args,
    model_config_from_args,
    parallel_config_from_args,
)
from meshprof.parallel.config import ParallelConfig
from meshprof.parallel.mapping import RankMapping, all_groups
from meshprof.parallel.memory import MemoryBreakdown, MemoryEstimate, estimate_memory
from meshprof.render.console import fmt_bytes

MAX_TABLE_RANKS = 64


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="rank table, groups and memory estimate of a dp×tp×pp layout")
    add_layout_args(p, default_layers=24, default_microbatches=8)
    add_model_args(p, d_model=1024, heads=16, vocab=50257, seq_len=1024)
    p.add_argument(
        "--param-bytes",
        type=int,
        choices=(2, 4, 8),
        default=4,
        help="bytes per parameter element (default 4: float32)",
    )
    p.add_argument(
        "--device-type",
        choices=("cuda", "cpu"),
        default="cuda",
        help="device the estimate is for (CPU offload only helps CUDA)",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="check that dp×tp×pp equals this number of ranks",
    )
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.set_defaults(func=run)


def _rank_rows(config: ParallelConfig) -> list[dict[str, Any]]:
    rows = []
    for r in range(config.world_size):
        m = RankMapping(config, r)
        layers = m.layers()
        rows.append(
            {
                "rank": r,
                "dp_rank": m.dp_rank,
                "tp_rank": m.tp_rank,
                "pp_rank": m.pp_rank,
                "stages": list(m.stage_indices()),
                "layers": list(layers),
                "prev_pp_rank": m.prev_pp_rank,
                "next_pp_rank": m.next_pp_rank,
            }
        )
    return rows


def _breakdown_dict(b: MemoryBreakdown) -> dict[str, Any]:
    return {
        "strategy": b.strategy,
        "pp_rank": b.pp_rank,
        "params_bytes": b.params_bytes,
        "grads_bytes": b.grads_bytes,
        "optimizer_bytes": b.optimizer_bytes,
        "activations_bytes": b.activations_bytes,
        "activations_no_ckpt_bytes": b.activations_no_ckpt_bytes,
        "activations_ckpt_bytes": b.activations_ckpt_bytes,
        "transient_bytes": b.transient_bytes,
        "offloaded_bytes": b.offloaded_bytes,
        "microbatches_in_flight": b.microbatches_in_flight,
        "total_bytes": b.total_bytes,
    }


def _layers_text(layers: list[int]) -> str:
    if not layers:
        return "-"
    runs: list[str] = []
    start = prev = layers[0]
    for x in [*layers[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        runs.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(runs)


def _memory_table(title: str, rows: list[MemoryBreakdown], first: str) -> Table:
    """Bytes per device; the per-stage table also shows activations with and without
    checkpointing (the strategy table shows each strategy's own choice)."""
    per_stage = first != "strategy"
    t = Table(title=title, title_justify="left")
    t.add_column(first)
    names = (
        ["params", "grads", "optim", "activ."]
        + (["no ckpt", "ckpt"] if per_stage else [])
        + ["temp", "total"]
    )
    for name in names:
        t.add_column(name, justify="right")
    for b in rows:
        cells = [
            fmt_bytes(b.params_bytes),
            fmt_bytes(b.grads_bytes),
            fmt_bytes(b.optimizer_bytes),
            fmt_bytes(b.activations_bytes),
        ]
        if per_stage:
            cells += [fmt_bytes(b.activations_no_ckpt_bytes), fmt_bytes(b.activations_ckpt_bytes)]
        cells += [fmt_bytes(b.transient_bytes), f"[bold]{fmt_bytes(b.total_bytes)}[/]"]
        t.add_row(str(b.pp_rank) if per_stage else b.strategy, *cells)
    return t


def _print(
    config: ParallelConfig,
    est: MemoryEstimate,
    rows: list[dict[str, Any]],
    groups: dict[str, list[tuple[int, ...]]],
) -> None:
    console = Console()
    m = est.model
    console.print(
        f"[bold]layout[/] dp={config.dp} × tp={config.tp} × pp={config.pp} = {config.world_size} ranks; "
        f"{config.num_layers} layers, {config.num_stages} pipeline stage(s) of {config.layers_per_stage if config.pp > 1 else config.num_layers} layers"
        + (
            f", schedule {config.schedule} (virtual stages {config.virtual_stages})"
            if config.pp > 1
            else ""
        )
    )
    console.print(
        f"[bold]model[/] d_model={m.d_model}, heads={m.n_heads}, ffn={m.ffn_hidden}, vocab={m.vocab_size}, seq={m.seq_len}: "
        f"{m.num_params(config.num_layers) / 1e6:.1f} M parameters; global batch {config.global_batch_size} sequences "
        f"({config.dp} DP × {config.num_microbatches} micro-batches × {config.micro_batch_size})"
    )
    t = Table(title="ranks (PP fastest, then TP, then DP)", title_justify="left")
    for name in ("rank", "dp", "tp", "pp", "stages", "layers", "prev pp", "next pp"):
        t.add_column(name, justify="right")
    for r in rows[:MAX_TABLE_RANKS]:
        t.add_row(
            str(r["rank"]),
            str(r["dp_rank"]),
            str(r["tp_rank"]),
            str(r["pp_rank"]),
            ",".join(map(str, r["stages"])),
            _layers_text(r["layers"]),
            "-" if r["prev_pp_rank"] is None else str(r["prev_pp_rank"]),
            "-" if r["next_pp_rank"] is None else str(r["next_pp_rank"]),
        )
    console.print(t)
    if len(rows) > MAX_TABLE_RANKS:
        console.print(f"… {len(rows) - MAX_TABLE_RANKS} more ranks (--json lists all)")
    g = Table(title="process groups (global ranks)", title_justify="left")
    g.add_column("dim")
    g.add_column("count", justify="right")
    g.add_column("size", justify="right")
    g.add_column("groups")
    for dim, gs in groups.items():
        text = " ".join("[" + ",".join(map(str, x)) + "]" for x in gs[:16]) + (
            " …" if len(gs) > 16 else ""
        )
        g.add_row(dim, str(len(gs)), str(len(gs[0])), text)
    console.print(g)
    console.print(
        _memory_table(
            f"memory per device, strategy {config.memory_strategy} ({est.param_bytes}-byte parameters, AdamW)",
            list(est.per_stage),
            "pp rank",
        )
    )
    console.print(
        _memory_table(
            "busiest device under each memory strategy", list(est.by_strategy), "strategy"
        )
    )
    console.print("[dim]assumptions:[/]")
    for a in est.assumptions:
        console.print(f"[dim]  - {a}[/]", highlight=False)


def run(args: argparse.Namespace) -> int:
    config = parallel_config_from_args(args)
    model = model_config_from_args(args)
    config.validate(
        args.world_size, n_heads=model.n_heads, hidden=model.d_model, ffn_hidden=model.ffn_hidden
    )
    est = estimate_memory(config, model, param_bytes=args.param_bytes, device_type=args.device_type)
    rows = _rank_rows(config)
    groups = {d: all_groups(config, d) for d in ("dp", "tp", "pp")}
    if args.json:
        out = {
            "config": config.to_dict(),
            "model": model.to_dict(),
            "num_params": model.num_params(config.num_layers),
            "ranks": rows,
            "groups": {d: [list(x) for x in gs] for d, gs in groups.items()},
            "memory": {
                "param_bytes": est.param_bytes,
                "device_type": args.device_type,
                "per_stage": [_breakdown_dict(b) for b in est.per_stage],
                "by_strategy": [_breakdown_dict(b) for b in est.by_strategy],
                "peak_bytes": est.peak.total_bytes,
                "assumptions": list(est.assumptions),
            },
        }
        print(json.dumps(out))
        return 0
    _print(config, est, rows, groups)
    return 0
