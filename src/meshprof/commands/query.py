"""``meshprof query RUN "SQL"``: SQL (DuckDB) over a run's tables.

RUN is a run directory (its tables are built in memory) or a folder written by
``meshprof export`` (its Parquet files are read in place). The tables are ``events``,
``spans``, ``memory``, ``groups`` and ``ranks`` (see :mod:`meshprof.render.parquet`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "query",
        help="run SQL (DuckDB) over a run's tables: events, spans, memory, groups, ranks",
        description="Run SQL over a run directory or a `meshprof export` folder. Tables: "
        "events, spans, memory, groups, ranks. Needs the 'query' extra (duckdb, pyarrow).",
    )
    p.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        help="a run directory (several: the node-local directories of one run), or a folder "
        "written by `meshprof export`",
    )
    p.add_argument("sql", help='e.g. "SELECT op, count(*) FROM events GROUP BY op"')
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    p.set_defaults(func=run)


def _require_duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        raise MeshprofError(
            "this needs duckdb: pip install 'meshprof[query]' (or pip install duckdb pyarrow)"
        ) from None
    return duckdb


def connect(run_dir: Path | list[Path]) -> Any:
    """A DuckDB connection with the run's tables as views (one directory, several node-local
    directories of one run, or an export folder)."""
    duckdb = _require_duckdb()
    from meshprof.render.parquet import OPTIONAL_TABLES, TABLES

    con = duckdb.connect()
    dirs = [Path(run_dir)] if isinstance(run_dir, str | Path) else [Path(x) for x in run_dir]
    d = dirs[0]
    if len(dirs) == 1 and d.is_dir() and (d / "events.parquet").exists():
        for name in TABLES:
            f = d / f"{name}.parquet"
            if not f.exists() and name in OPTIONAL_TABLES:
                continue  # (an export of an older version)
            if not f.exists():
                raise MeshprofError(f"{f}: missing (write the folder with `meshprof export`)")
            path = str(f).replace("'", "''")
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
        return con
    from meshprof.render.parquet import export_tables
    from meshprof.rundir import load_run

    for name, t in export_tables(load_run(dirs)).items():
        con.register(name, t)
    return con


def run(args: argparse.Namespace) -> int:
    duckdb = _require_duckdb()
    con = connect([Path(d) for d in args.dirs])
    try:
        rel = con.sql(args.sql)
        if rel is None:  # a statement without a result
            return 0
        cols = list(rel.columns)
        rows = rel.fetchall()
    except duckdb.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MeshprofError(f"query failed: {first}") from None
    if args.json:
        print(json.dumps([dict(zip(cols, r, strict=True)) for r in rows], default=str))
        return 0
    text = [[_fmt(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in text]) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for r in text:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _fmt(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)
