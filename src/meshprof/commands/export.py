"""``meshprof export RUN --format parquet DIR``: write a run as Parquet tables;
``meshprof export RUN --format otlp --endpoint URL``: send its steps and findings over OTLP."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from meshprof.errors import MeshprofError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a run directory as Parquet tables, or send it over OTLP (OpenTelemetry)",
        description="Write a run as Arrow/Parquet tables for DuckDB, pandas, Polars or Spark: "
        "events (one row per event, with its rank and aligned time), spans, memory, groups, "
        "ranks, and the per-step totals of the whole run (steps); needs the 'parquet' extra "
        "(pyarrow). Or, with --format otlp, send its steps (one trace each, ranks and phases "
        "as spans, clock-aligned timestamps), alerts, captures and findings to an OTLP "
        "endpoint; needs the 'otel' extra.",
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="DIR",
        help="a run directory (meshprof run -o DIR); several: the node-local directories of one "
        "run; with --format parquet the last is the folder to write <table>.parquet into",
    )
    p.add_argument("--format", choices=["parquet", "otlp"], default="parquet")
    p.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="otlp: the collector or backend (default $OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    p.add_argument(
        "--protocol",
        default=None,
        metavar="PROTOCOL",
        help="otlp: grpc or http/protobuf (default $OTEL_EXPORTER_OTLP_PROTOCOL, else "
        "http/protobuf)",
    )
    p.add_argument(
        "--every",
        default="1",
        metavar="N",
        help="otlp: send every Nth step (default 1: all of them)",
    )
    p.add_argument("--json", action="store_true", help="print what was written or sent as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.format == "otlp":
        return _otlp(args)
    for name in ("endpoint", "protocol"):
        if getattr(args, name) is not None:
            raise MeshprofError(f"--{name} is for --format otlp")
    if len(args.paths) < 2:
        raise MeshprofError("give the run directory and the folder to write the tables into")
    dirs, out = args.paths[:-1], Path(args.paths[-1])
    from meshprof.render.parquet import export_tables, require_pyarrow, write_parquet
    from meshprof.rundir import load_run

    require_pyarrow()  # before loading: a missing extra fails at once
    if any(out.resolve() == Path(d).resolve() for d in dirs):
        raise MeshprofError(f"{out}: write the tables to another folder than the run directory")
    tables = export_tables(load_run([Path(d) for d in dirs]))
    paths = write_parquet(tables, out)
    rows = {name: t.num_rows for name, t in tables.items()}
    if args.json:
        print(json.dumps({"out": str(out), "files": [str(p) for p in paths], "rows": rows}))
    else:
        print(f"wrote {out}: " + ", ".join(f"{n}.parquet ({r:,} rows)" for n, r in rows.items()))
    return 0


def _otlp(args: argparse.Namespace) -> int:
    from meshprof.commands.arguments import option_number
    from meshprof.live.otel.postmortem import export_run
    from meshprof.live.otel.settings import check_installed, resolve_settings

    every = option_number(args.every, "--every", int)
    settings = resolve_settings(args.endpoint, args.protocol, what="--endpoint")
    if settings is None or settings.traces is None:
        raise MeshprofError(
            "--format otlp needs an endpoint: --endpoint URL or OTEL_EXPORTER_OTLP_ENDPOINT"
        )
    check_installed(settings)
    for d in args.paths:
        if not Path(d).is_dir():
            raise MeshprofError(f"{d}: not a run directory")
    res = export_run(args.paths, settings, every)
    if args.json:
        print(json.dumps({**res.to_dict(), "trace_ids": res.trace_ids[:1]}))
    else:
        print(
            f"sent {res.steps:,} steps ({res.rank_steps:,} ranks' steps), {res.requests:,} "
            f"requests ({res.spans:,} spans in all), {res.alerts} alerts, {res.captures} captures and {res.findings} findings to "
            f"{res.endpoint}"
        )
    if res.failed_spans:
        print(
            f"meshprof export: {res.failed_spans:,} spans were not accepted ({res.error})",
            file=sys.stderr,
        )
        return 1
    return 0
