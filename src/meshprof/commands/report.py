"""``meshprof report DIR``: analyze a run directory across ranks and show it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from meshprof.analyze.run.events.window import parse_steps, parse_time, run_start_ns, steps_between
from meshprof.analyze.run.stragglers.stragglers import DEFAULT_THRESHOLD
from meshprof.errors import MeshprofError, NotATraceError, NoUsableRankFileError
from meshprof.records.serving import ServiceLevels
from meshprof.report.analysis import analyze_run, analyze_run_parts
from meshprof.report.stage import ReportOptions
from meshprof.report.workers import default_workers
from meshprof.rundir import load_run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="cross-rank report of a run directory (stragglers, waits, clocks)"
    )
    p.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        help="run directory (manifest.json + rank folders); several: the node-local directories "
        "of one run, analysed together",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--full",
        action="store_true",
        help="print every table (one row per rank and group) after the verdict, instead of the "
        "brief view (spreads across ranks, outliers, groups by kind); with --json: every "
        "rank's per-step rows also above 1,024 ranks",
    )
    p.add_argument(
        "--ranks",
        metavar="R,R",
        help="after the brief view, the per-rank rows of these ranks (e.g. 3,17)",
    )
    p.add_argument(
        "--device-hour-price",
        "--gpu-hour-price",
        dest="device_hour_price",
        type=float,
        default=None,
        metavar="PRICE",
        help="price of one device-hour (a GPU-hour; a CPU-hour on a CPU job): the verdict "
        "gives each cause's cost in money too (--gpu-hour-price: its former name)",
    )
    p.add_argument(
        "--all-causes",
        action="store_true",
        help="the verdict lists every cause, also those under 2%% of the step",
    )
    p.add_argument(
        "--steps",
        metavar="A:B",
        help="analyse steps A to B-1 only (A:, :B too); 'all': the whole run even when something "
        "changed mid-run (by default the report analyses the steps since the latest change)",
    )
    p.add_argument(
        "--since",
        metavar="TIME",
        help="analyse the steps that started at or after TIME: 14:02:11 (the run's day), "
        "2026-11-25T14:02:11, or a duration after the run's start (90s, 5m, 2h)",
    )
    p.add_argument("--until", metavar="TIME", help="... and before TIME (as --since)")
    p.add_argument(
        "--slo",
        metavar="NAME=TIME,...",
        help="service levels of a serving run (ttft, tpot, itl, e2e; e.g. ttft=200ms,tpot=50ms): "
        "the goodput counts the requests that met them all",
    )
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--trace", metavar="FILE", help="write a merged Perfetto/Chrome JSON trace")
    p.add_argument(
        "--trace-max-events",
        type=int,
        default=None,
        metavar="N",
        help="collectives the trace keeps: beyond N, only the last whole steps that fit "
        "(default 250000; 0 keeps everything)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help="straggler score threshold (fraction, default 0.05)",
    )
    p.add_argument(
        "--hta-rounding",
        action="store_true",
        help="torch.profiler traces: round sub-µs times to whole µs as Holistic Trace Analysis "
        "0.5 does, to reproduce its figures exactly (default: exact ns)",
    )
    p.add_argument(
        "--sample",
        metavar="F",
        help="analyse a consistent sample of this fraction of the collectives (0 < F <= 1), "
        "chosen by the recorder's (group, seq) hash so every member's copy is kept; the report "
        "states the error of its main figures",
    )
    p.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="memory budget (e.g. 4G, 512M): a run whose report would need more is sampled to "
        "fit (default: half of the available memory; --sample overrides)",
    )
    p.add_argument(
        "--jobs",
        metavar="N",
        help="processes for loading the rank files and the per-rank step analyses (default: the "
        "usable cores, at most 16, from 64 ranks on; 1: all in this process). Linux only; "
        "elsewhere all runs in-process",
    )
    p.set_defaults(func=run)


def _rank_files(run_dirs: list[str]) -> int:
    """How many ranks ``run_dirs`` hold (folders of segments or rank files)."""
    from meshprof.rundir.schema import rank_entries

    return sum(len(rank_entries(d)) for d in run_dirs)


def _ranks_option(text: str | None) -> list[int]:
    """``--ranks 3,17`` as rank numbers ([] when not given)."""
    if text is None:
        return []
    try:
        ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MeshprofError(
            f"--ranks must be rank numbers separated by commas, got {text!r}"
        ) from None
    if not ranks or min(ranks) < 0:
        raise MeshprofError(f"--ranks must be rank numbers >= 0, got {text!r}")
    return ranks


def _jobs(text: str | None) -> int | None:
    """``--jobs`` as a positive int (None: not given)."""
    if text is None:
        return None
    try:
        n = int(text)
    except ValueError:
        raise MeshprofError(f"--jobs must be a whole number >= 1, got {text!r}") from None
    if n < 1:
        raise MeshprofError(f"--jobs must be a whole number >= 1, got {text!r}")
    return n


def _sample_fraction(args: argparse.Namespace) -> tuple[float, str]:
    """(fraction, reason) from ``--sample`` or, without it, from the memory budget."""
    from meshprof.render.format import fmt_bytes
    from meshprof.rundir.sampling import (
        choose_fraction,
        default_budget,
        estimate_report_bytes,
        events_on_disk,
        parse_bytes,
        parse_fraction,
    )

    budget = parse_bytes(args.max_memory) if args.max_memory else None
    if budget is not None and budget <= 0:
        raise MeshprofError(f"--max-memory must be positive, got {args.max_memory!r}")
    if args.sample is not None:
        return parse_fraction(args.sample), f"--sample {args.sample}"
    if not all(Path(d).is_dir() for d in args.dirs):
        return 1.0, ""
    events = events_on_disk(args.dirs)
    limit = budget if budget is not None else default_budget()
    f = choose_fraction(events, limit)
    if f >= 1:
        return 1.0, ""
    named = "--max-memory" if budget is not None else "half of the available memory"
    return f, (
        f"about {events:,} events would need about {fmt_bytes(estimate_report_bytes(events))}, "
        f"over {fmt_bytes(limit)} ({named})"
    )


def _merge_kineto(trace: dict[str, Any], loaded: Any, clock: Any) -> None:
    """Link the run's torch.profiler traces (and its captures' traces) into the merged
    timeline: each rank's trace events join that rank's process, moved onto the aligned clock."""
    from meshprof.analyze.traces.kineto import find_traces, kineto_events, load_trace, trace_rank
    from meshprof.rundir.captures import capture_traces

    origin = int(trace.get("metadata", {}).get("t0_ns", 0))
    merged = 0
    for path in [*find_traces(loaded.path), *capture_traces(loaded.path)]:
        try:
            rank = trace_rank(load_trace(path), path)
            trace["traceEvents"] += kineto_events(path, rank, clock.offset(rank), origin_ns=origin)
            merged += 1
        except NotATraceError:
            continue  # JSON but no trace (a comm log, a config): not ours to merge
        except MeshprofError as e:
            trace.setdefault("metadata", {}).setdefault("kineto_errors", []).append(f"{path}: {e}")
        except Exception as e:  # a damaged trace is named, never fatal
            trace.setdefault("metadata", {}).setdefault("kineto_errors", []).append(f"{path}: {e}")
    trace.setdefault("metadata", {})["kineto_traces_merged"] = merged


def _traces_only(args: argparse.Namespace, why: NoUsableRankFileError) -> int:
    """``report DIR`` on a folder of torch.profiler traces without meshprof rank files."""
    from meshprof.analyze.traces.kineto import find_traces, kineto_report

    folder = Path(args.dirs[0])
    paths = find_traces(folder)
    if not paths:
        raise MeshprofError(
            f"{why}, and no torch.profiler traces (*.json, *.json.gz, also under traces/)"
        ) from None
    if args.trace:
        raise MeshprofError(
            f"--trace needs a meshprof run directory; {folder} holds torch.profiler traces only "
            "(open them in Perfetto directly)"
        )
    k = kineto_report(paths, hta_rounding=args.hta_rounding)
    if not k.ranks:
        detail = "; ".join(k.problems) if k.problems else "no file there holds a traceEvents list"
        raise MeshprofError(f"{folder}: no readable torch.profiler trace ({detail})") from None
    # damaged rank files beside the traces are said, not hidden
    rank_files = str(why) if why.problems else ""
    written = []
    if args.html:
        from meshprof.render.html import write_kineto_html

        written.append(write_kineto_html(Path(args.html), str(folder), k))
    if args.json:
        summary = {
            "path": str(folder),
            "traces": len(paths),
            "ranks": [b.rank for b in k.ranks],
            "rank_files": rank_files or None,
        }
        print(json.dumps({"summary": summary, "kineto": k.to_dict()}, default=str))
        return 0
    from meshprof.render.kineto_view import print_kineto

    console = Console()
    console.print(
        f"[bold]meshprof report[/] {folder}: torch.profiler traces only, "
        f"{len(k.ranks)} ranks from {len(paths)} files",
        highlight=False,
    )
    if rank_files:
        console.print(rank_files, highlight=False, markup=False)
    print_kineto(k, console)
    for w in written:
        console.print(f"wrote {w}", highlight=False)
    return 0


def run(args: argparse.Namespace) -> int:
    if not (0.0 < args.threshold < 10.0):
        raise MeshprofError(f"--threshold must be a fraction in (0, 10), got {args.threshold}")
    for opt in ("html", "trace"):
        target = getattr(args, opt)
        if target and Path(target).is_dir():
            raise MeshprofError(f"--{opt} {target}: is a directory (give a file name)")
    if args.trace_max_events is not None and args.trace_max_events < 0:
        raise MeshprofError(f"--trace-max-events must be >= 0, got {args.trace_max_events}")
    if args.device_hour_price is not None and not args.device_hour_price >= 0:
        raise MeshprofError(f"--device-hour-price must be >= 0, got {args.device_hour_price}")
    wanted = _ranks_option(args.ranks)
    window = parse_steps(args.steps) if args.steps else None
    if args.steps and (args.since or args.until):
        raise MeshprofError("--steps and --since/--until: give one or the other")
    jobs = _jobs(args.jobs)
    fraction, reason = _sample_fraction(args)
    try:
        # the report reads only the completed events' columns: loaded lean
        loaded = load_run(
            [Path(d) for d in args.dirs],
            lean=True,
            sample=fraction,
            sample_reason=reason,
            processes=jobs if jobs is not None else default_workers(_rank_files(args.dirs)),
        )
    except NoUsableRankFileError as e:
        return _traces_only(args, e)
    if args.since or args.until:
        start = run_start_ns(loaded)
        window = steps_between(
            loaded,
            parse_time(args.since, start) if args.since else None,
            parse_time(args.until, start) if args.until else None,
        )
    # nothing below reads the raw event rows: the analysis lets them go once tabled
    options = ReportOptions(
        window=window,
        regime=args.steps is None or args.steps.strip() not in ("all", ":"),
        threshold=args.threshold,
        hta_rounding=args.hta_rounding,
        release_events=True,
        workers=jobs if jobs is not None else default_workers(len(loaded.ranks)),
        device_hour_price=args.device_hour_price,
        all_causes=args.all_causes,
        slo=ServiceLevels.parse(args.slo) if args.slo else None,
    )
    # the event table and the match outlive the report only for the trace
    parts = analyze_run_parts(loaded, options) if args.trace else None
    rep = parts.report if parts is not None else analyze_run(loaded, options)
    written = []
    if args.html:
        from meshprof.render.html import write_html

        written.append(write_html(Path(args.html), rep))
    if parts is not None:
        from meshprof.analyze.run.conclusions.timeline_excerpt import DEFAULT_MAX_EVENTS
        from meshprof.render.perfetto import build_trace, write_trace

        cap = DEFAULT_MAX_EVENTS if args.trace_max_events is None else args.trace_max_events
        trace = build_trace(parts.run, parts.table, parts.clock, parts.match, max_events=cap)
        _merge_kineto(trace, parts.run, parts.clock)
        written.append(write_trace(Path(args.trace), trace))
    if args.json:
        from meshprof.report.run_report import PER_STEP_JSON_RANKS

        # section by section: no whole dict of the report
        rep.write_json(sys.stdout, per_step_ranks=None if args.full else PER_STEP_JSON_RANKS)
        sys.stdout.write("\n")
        return 0
    console = Console(width=None if sys.stdout.isatty() else (160 if args.full else 80))
    if args.full:
        from meshprof.render.report_text import print_report

        print_report(rep, console)
    else:
        from meshprof.render.report_brief import print_brief, print_rank_rows

        print_brief(rep, console)
        if wanted:
            print_rank_rows(rep, console, wanted)
    for w in written:
        console.print(f"wrote {w}", highlight=False)
    return 0
