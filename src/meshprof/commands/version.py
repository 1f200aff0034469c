"""``meshprof version``: versions of meshprof, torch and the distributed backends, and which\ncollective recorder (native or Python kernel) ``meshprof.enable()`` would use here."""

from __future__ import annotations

import argparse
import json
import platform
from typing import Any


def versions() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from meshprof import __version__
    from meshprof.comm.selection import planned_recorder

    nccl = ""
    try:
        if torch.cuda.is_available():
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:
        nccl = ""
    return {
        "meshprof": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda or "",
        "nccl": nccl,
        "gloo": bool(dist.is_available() and dist.is_gloo_available()),
        "nccl_available": bool(dist.is_available() and dist.is_nccl_available()),
        "recorder": planned_recorder(),
    }


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("version", help="print meshprof's version and its environment")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    v = versions()
    if args.json:
        print(json.dumps(v))
    else:
        print(
            f"meshprof {v['meshprof']} (torch {v['torch']}, python {v['python']}"
            + (f", cuda {v['cuda']}, nccl {v['nccl']}" if v["cuda"] else "")
            + ")"
        )
        r = v["recorder"]
        print(f"recorder: {r['kernel']} ({r['reason']})")
        print(f"native recorder cache: {r['native_cache']}")
    return 0
