"""``meshprof stacks RUN_DIR``: every rank's Python stack now, ranks with identical stacks
grouped, the outliers named."""

from __future__ import annotations

import argparse
import json
import time

from meshprof.commands.arguments import add_json_option
from meshprof.errors import MeshprofError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "stacks",
        help="every rank's Python stack now, clustered, outliers named",
        description="Ask every rank of a job running under meshprof run for its Python stacks "
        "(all threads) now, through the run directory; group the ranks whose main-thread "
        "stacks are identical and name the outliers. A rank that does not answer within the "
        "timeout is named (dead, stopped, or holding the GIL). Exit code 2 when no rank "
        "answered.",
    )
    p.add_argument("dir", metavar="RUN_DIR", help="the run directory of the running job")
    p.add_argument(
        "--ranks", default=None, metavar="R,R", help="only these ranks (default: every rank)"
    )
    p.add_argument(
        "--timeout", default="5", metavar="SECONDS", help="how long to wait for answers (default 5)"
    )
    p.add_argument(
        "--all-threads", action="store_true", help="also print every thread of every rank"
    )
    add_json_option(p, "the clusters and every rank's stacks")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshprof.analyze.hang.stacks import snapshot_of
    from meshprof.commands.capture import parse_ranks
    from meshprof.live.capture_request import running_job, take_stacks
    from meshprof.records.codec import to_json
    from meshprof.records.members import named_world
    from meshprof.render.stacks import stacks_text

    try:
        timeout = float(args.timeout)
    except ValueError:
        timeout = float("nan")
    if not timeout > 0:
        raise MeshprofError(f"--timeout {args.timeout!r}: expected a number of seconds > 0")
    snap, world = running_job(args.dir)
    named = parse_ranks(args.ranks, world) if args.ranks is not None else ()
    asked = list(named) if named else list(named_world(world))
    running = [r for r in asked if r in snap.ranks and snap.ranks[r].status == "running"]
    t0 = time.monotonic()
    request_id, got = take_stacks(args.dir, running or asked, timeout, named)
    result = snapshot_of(request_id, asked, got, time.monotonic() - t0)
    if args.json:
        print(json.dumps(to_json(result)))
    else:
        print(stacks_text(result, args.all_threads))
    if not got:
        raise MeshprofError(f"no rank answered within {timeout:g} s")
    return 0
