"""``meshprof plan --dp 2 --tp 2 --pp 2 --layers 24``: the rank table, the process groups and
the per-device memory estimate of a 3D-parallel layout, without starting anything."""

from __future__ import annotations

import argparse
import json
from typing import Any

from meshprof.commands.arguments import add_json_option
from meshprof.parallel import args as layout_options
from meshprof.parallel.mapping import RankMapping, all_groups
from meshprof.parallel.memory_estimate import MemoryBreakdown, estimate_memory
from meshprof.parallel.parallel_config import ParallelConfig
from meshprof.render.plan import print_plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="rank table, groups and memory estimate of a dp×tp×pp layout")
    layout_options.add_layout_args(p, default_layers=24, default_microbatches=8)
    layout_options.add_model_args(p, d_model=1024, heads=16, vocab=50257, seq_len=1024)
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
    add_json_option(p, "everything")
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


def run(args: argparse.Namespace) -> int:
    config = layout_options.parallel_config_from_args(args)
    model = layout_options.model_config_from_args(args)
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
    print_plan(config, est, rows, groups)
    return 0
