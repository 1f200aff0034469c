"""``meshprof export RUN --format parquet DIR``: write a run as Parquet tables."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshprof.errors import MeshprofError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a run directory as Parquet tables (events, spans, memory, groups, ranks, steps)",
        description="Write a run as Arrow/Parquet tables for DuckDB, pandas, Polars or Spark: "
        "events (one row per event, with its rank and aligned time), spans, memory, groups, "
        "ranks, and the per-step totals of the whole run (steps). Needs the 'parquet' extra "
        "(pyarrow).",
    )
    p.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        help="a run directory (meshprof run -o DIR); several: the node-local directories of one "
        "run",
    )
    p.add_argument("out", help="folder to write <table>.parquet into")
    p.add_argument("--format", choices=["parquet"], default="parquet")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshprof.render.parquet import export_tables, require_pyarrow, write_parquet
    from meshprof.rundir import load_run

    require_pyarrow()  # before loading: a missing extra fails at once
    out = Path(args.out)
    if any(out.resolve() == Path(d).resolve() for d in args.dirs):
        raise MeshprofError(f"{out}: write the tables to another folder than the run directory")
    tables = export_tables(load_run([Path(d) for d in args.dirs]))
    paths = write_parquet(tables, out)
    rows = {name: t.num_rows for name, t in tables.items()}
    if args.json:
        print(json.dumps({"out": str(out), "files": [str(p) for p in paths], "rows": rows}))
    else:
        print(f"wrote {out}: " + ", ".join(f"{n}.parquet ({r:,} rows)" for n, r in rows.items()))
    return 0
