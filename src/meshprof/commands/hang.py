"""``meshprof hang DIR``: say why a job hung, from the ranks' dumps."""

from __future__ import annotations

import argparse
import json

from meshprof.analyze.hang.diagnose import diagnose_hang
from meshprof.commands.arguments import add_json_option
from meshprof.render.hang import render_hang_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hang",
        help="diagnose a hang or desync from watchdog / Flight Recorder dumps",
        description="Read DIR/hang/rank*.json (meshprof watchdog dumps) and fr_rank*.json "
        "(PyTorch Flight Recorder JSON dumps) and say which ranks never entered which "
        "collective, where they are, and which ranks called different ops, sizes or dtypes. "
        "Exit code 1 when something is wrong.",
    )
    p.add_argument("dir", help="the run directory, or the folder holding the dumps")
    add_json_option(p, "the diagnosis")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    diag = diagnose_hang(args.dir)
    if args.json:
        print(json.dumps(diag.to_dict()))
    else:
        print(render_hang_text(diag))
    return 0 if diag.ok else 1
