"""Text of ``meshprof plan``: the layout and model in words, the rank table, the process groups
and the per-device memory tables (bytes shown with binary units); nothing is computed here."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from meshprof.parallel.memory_estimate import MemoryBreakdown, MemoryEstimate
from meshprof.parallel.parallel_config import ParallelConfig
from meshprof.render.format import fmt_bytes

MAX_TABLE_RANKS = 64
"""Ranks the rank table shows (``--json`` lists all)."""


def _layers_text(layers: list[int]) -> str:
    """Layer indices as runs: [0, 1, 2, 5] -> "0-2,5"."""
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


def print_plan(
    config: ParallelConfig,
    est: MemoryEstimate,
    rows: list[dict[str, Any]],
    groups: dict[str, list[tuple[int, ...]]],
) -> None:
    """Print the layout, the model, the rank table (the first :data:`MAX_TABLE_RANKS` ranks), the
    process groups and the memory tables to the terminal. ``rows``: one dict per rank as
    ``meshprof plan --json`` lists them."""
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


__all__ = ["MAX_TABLE_RANKS", "print_plan"]
