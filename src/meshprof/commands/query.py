"""``meshprof query RUN "SQL"``: SQL (DuckDB) over a run's tables.

RUN is a run directory (its tables are built in memory) or a folder written by
``meshprof export`` (its Parquet files are read in place). The tables are ``events``,
``spans``, ``memory``, ``steps``, ``groups`` and ``ranks`` (see :mod:`meshprof.render.parquet`).

``--rank R`` (and ``--step S``) is the point question: only those ranks' folders are read (at
100,000 ranks, one folder instead of the run), the tables hold only their rows (and only step
S's); without SQL it prints the step totals and the events. Their times are the rank's own
clock aligned by its own timestamp exchange; ``wait_ns`` is null (a wait needs the other
members of each collective: query the whole run for it).
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
        "items",
        nargs="+",
        metavar="DIR ... SQL",
        help="a run directory (several: the node-local directories of one run), or a folder "
        'written by `meshprof export`; then the SQL, e.g. "SELECT op, count(*) FROM events '
        'GROUP BY op" (optional with --rank: the step totals and events of the ranks)',
    )
    p.add_argument(
        "--rank",
        type=parse_ranks,
        default=None,
        metavar="R",
        help="read only these ranks (47, or 40-47,63): a point query that does not load the run",
    )
    p.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="S",
        help="with --rank: only step S's rows in events, spans, memory and steps",
    )
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


def parse_ranks(text: str) -> tuple[int, ...]:
    """ "47" → (47,); "40-43,63" → (40, 41, 42, 43, 63). argparse turns the ValueError into
    its one-line usage error (exit 2)."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r}: expected ranks such as 47 or 40-47,63")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or b - a >= 65536:
            raise argparse.ArgumentTypeError(f"{part!r}: expected a range low-high, at most 65,536")
        out.extend(range(a, b + 1))
    return tuple(dict.fromkeys(out))


STEP_TABLES = ("events", "spans", "memory", "steps")
"""The tables with a ``step`` column (``--step`` keeps only that step's rows)."""


def _load_point(dirs: list[Path], ranks: tuple[int, ...]) -> Any:
    """The run with ``ranks`` loaded from their own folders (:func:`load_run` with
    ``only_ranks``); a rank that is not there is a :class:`MeshprofError` naming the run's."""
    from meshprof.errors import NoUsableRankFileError
    from meshprof.rundir import load_run
    from meshprof.rundir.manifest import read_manifest

    for d in dirs:
        if d.is_dir() and (d / "events.parquet").exists():
            raise MeshprofError(
                f"{d}: an export folder; --rank reads a run directory (filter the export "
                "in SQL: WHERE rank = R)"
            )
    run = None
    try:
        run = load_run(dirs, only_ranks=ranks)
        absent = [r for r in ranks if r not in run.ranks]
        world, why = run.world_size, run.problems.get(absent[0], "") if absent else ""
    except NoUsableRankFileError:
        absent = list(ranks)
        try:
            world, why = int(read_manifest(dirs[0]).world_size or 0), ""
        except MeshprofError:
            world, why = 0, ""
    if absent:
        size = f"the run has {world:,} ranks, 0-{world - 1}" if world > 0 else "no such rank"
        raise MeshprofError(f"rank {absent[0]}: not in {dirs[0]} ({why or size})")
    return run


def point_tables(dirs: list[Path], ranks: tuple[int, ...], step: int | None) -> dict[str, Any]:
    """The tables (``pyarrow.Table``) of ``ranks`` only, read from their own folders, and only
    ``step``'s rows in the tables with a step column when it is given (for SQL over them)."""
    from meshprof.commands.query_point import point_rows
    from meshprof.render.parquet import export_tables, require_pyarrow

    pa = require_pyarrow()
    import pyarrow.compute as pc

    run = _load_point(dirs, ranks)
    if step is not None:
        point_rows(run, ranks[:1], step)  # a step the rank did not record: the error
    tables = export_tables(run)
    if step is None:
        return tables
    for name in STEP_TABLES:
        t = tables[name]
        tables[name] = t.filter(pc.equal(t["step"], pa.scalar(step, t.schema.field("step").type)))
    return tables


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


def split_items(items: list[str], point: bool) -> tuple[list[Path], str | None]:
    """The directories and the SQL of ``DIR ... SQL``: the last item is the SQL, except with
    ``--rank`` (``point``) when it is an existing directory (the point query's default)."""
    if point and Path(items[-1]).is_dir():
        return [Path(x) for x in items], None
    if len(items) < 2:
        raise MeshprofError(
            f"{items[0]}: no such run directory"
            if point
            else 'give a run directory, then the SQL: meshprof query DIR "SELECT ..."'
        )
    return [Path(x) for x in items[:-1]], items[-1]


def run(args: argparse.Namespace) -> int:
    if args.step is not None and args.rank is None:
        raise MeshprofError("--step needs --rank (or filter in SQL: WHERE step = S)")
    dirs, sql = split_items(list(args.items), args.rank is not None)
    if args.rank is None:
        assert sql is not None
        return _print(_query(connect(dirs), sql), args.json)
    if sql is not None:
        tables = point_tables(dirs, args.rank, args.step)
        con = _require_duckdb().connect()
        for name, t in tables.items():
            con.register(name, t)
        return _print(_query(con, sql), args.json)
    from meshprof.commands.query_point import point_rows

    got = point_rows(_load_point(dirs, args.rank), args.rank, args.step)
    if args.json:
        print(json.dumps({name: _records(*res) for name, res in got.items()}, default=str))
        return 0
    for i, (name, res) in enumerate(got.items()):
        print(("\n" if i else "") + f"{name}:")
        _print(res, False)
    return 0


def _query(con: Any, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    duckdb = _require_duckdb()
    try:
        rel = con.sql(sql)
        if rel is None:  # a statement without a result
            return [], []
        return list(rel.columns), rel.fetchall()
    except duckdb.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MeshprofError(f"query failed: {first}") from None


def _records(cols: list[str], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(cols, r, strict=True)) for r in rows]


def _print(res: tuple[list[str], list[tuple[Any, ...]]], as_json: bool) -> int:
    cols, rows = res
    if not cols:
        return 0
    if as_json:
        print(json.dumps(_records(cols, rows), default=str))
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
