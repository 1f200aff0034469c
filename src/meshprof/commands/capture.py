"""``meshprof capture RUN_DIR``: trace a few steps with torch.profiler on chosen ranks of a job
running under ``meshprof run`` (default: the live straggler and a healthy peer with the same
role), wait, and say which ops differ most between them."""

from __future__ import annotations

import argparse
import json
import sys
import time

from meshprof.commands.arguments import add_json_option
from meshprof.errors import MeshprofError
from meshprof.records.captures import (
    ACTIVITIES,
    MAX_CAPTURE_STEPS,
    MAX_TIMEOUT_S,
    CaptureRankStatus,
)

#: Default disk budget of RUN_DIR/captures.
DEFAULT_MAX_BYTES = "2G"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capture",
        help="trace K steps on chosen ranks of a running job and compare them",
        description="Ask ranks of a job running under meshprof run to trace their next K steps "
        "with torch.profiler (from their next step boundary), wait for the traces, and print "
        "the ops (and CUDA kernels) whose time per step differs most between the first rank "
        "and the others, per step phase, with each rank's Kineto breakdown. The request goes "
        "through the run directory; ranks not named do nothing. Exit code 2 when no rank "
        "traced anything.",
    )
    p.add_argument("dir", metavar="RUN_DIR", help="the run directory of the running job")
    p.add_argument(
        "--ranks",
        default=None,
        metavar="R,R",
        help="the ranks to trace, the one to look at first (default: the live straggler, else "
        "the rank that computes longest, and a healthy peer with the same role)",
    )
    p.add_argument(
        "--steps",
        default="3",
        metavar="K",
        help=f"steps to trace (1 to {MAX_CAPTURE_STEPS}; default 3)",
    )
    p.add_argument(
        "--activities",
        default=None,
        metavar="LIST",
        help="torch.profiler activities: cpu, cuda (default: cpu, and cuda where available)",
    )
    p.add_argument("--record-shapes", action="store_true", help="record the ops' input shapes")
    p.add_argument(
        "--with-stack", action="store_true", help="record the ops' Python stacks (larger traces)"
    )
    p.add_argument(
        "--timeout",
        default=None,
        metavar="SECONDS",
        help="how long to wait for the ranks (default: 10 s + twice the time of K+1 steps, "
        "at least 20 s)",
    )
    p.add_argument(
        "--max-bytes",
        default=DEFAULT_MAX_BYTES,
        metavar="SIZE",
        help=f"disk budget of RUN_DIR/captures (default {DEFAULT_MAX_BYTES}): no capture past it",
    )
    add_json_option(p, "the comparison")
    p.set_defaults(func=run)


def _int(text: str, option: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise MeshprofError(f"{option} {text!r}: expected a whole number") from None


def parse_ranks(text: str, world: int) -> tuple[int, ...]:
    """``"5,6"`` -> (5, 6), each in [0, world) and named once."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise MeshprofError(f"--ranks {text!r}: expected ranks such as 5,6")
    ranks = tuple(_int(p, "--ranks") for p in parts)
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise MeshprofError(
            f"--ranks {text!r}: rank {bad[0]} is not in the job (ranks 0–{world - 1})"
        )
    if len(set(ranks)) != len(ranks):
        raise MeshprofError(f"--ranks {text!r}: a rank is named twice")
    return ranks


def parse_activities(text: str | None) -> tuple[str, ...]:
    """``"cpu,cuda"`` -> ("cpu", "cuda"); None -> () (cpu, and cuda where available)."""
    if text is None:
        return ()
    acts = tuple(a.strip().lower() for a in text.split(",") if a.strip())
    bad = [a for a in acts if a not in ACTIVITIES]
    if bad or not acts:
        raise MeshprofError(f"--activities {text!r}: expected some of {', '.join(ACTIVITIES)}")
    return acts


def default_timeout(steps: int, step_ns: int) -> float:
    """10 s plus twice the time of ``steps`` + 1 steps (the wait for the next boundary), at
    least 20 s, at most :data:`~meshprof.records.captures.MAX_TIMEOUT_S`."""
    return min(max(20.0, 10.0 + 2.0 * (steps + 1) * step_ns / 1e9), MAX_TIMEOUT_S)


def run(args: argparse.Namespace) -> int:
    from meshprof.analyze.live.capture_targets import choose_targets
    from meshprof.layout import Layout
    from meshprof.live.capture_request import run_capture, running_job
    from meshprof.records.captures import CaptureRequest
    from meshprof.records.codec import to_json
    from meshprof.render.captures import capture_text
    from meshprof.rundir.captures import captures_bytes
    from meshprof.rundir.manifest import read_manifest
    from meshprof.rundir.requests import new_request_id
    from meshprof.rundir.sampling import parse_bytes

    steps = _int(args.steps, "--steps")
    if not 1 <= steps <= MAX_CAPTURE_STEPS:
        raise MeshprofError(f"--steps {steps}: expected 1 to {MAX_CAPTURE_STEPS}")
    activities = parse_activities(args.activities)
    try:
        max_bytes = parse_bytes(args.max_bytes)
    except MeshprofError:
        raise MeshprofError(f"--max-bytes {args.max_bytes!r}: expected a size such as 2G") from None
    timeout = None
    if args.timeout is not None:
        try:
            timeout = float(args.timeout)
        except ValueError:
            timeout = float("nan")
        if not 0 < timeout <= MAX_TIMEOUT_S:
            raise MeshprofError(
                f"--timeout {args.timeout!r}: expected a number of seconds, 0 to {MAX_TIMEOUT_S:g}"
            )
    snap, world = running_job(args.dir)
    if args.ranks is not None:
        ranks = parse_ranks(args.ranks, world)
        reason = "named with --ranks"
    else:
        try:
            layout = Layout.from_any(read_manifest(args.dir, strict=False).layout)
        except Exception:
            layout = None
        targets = choose_targets("demand", (), snap, layout, world)
        if targets is None:
            raise MeshprofError(f"{args.dir}: no rank to capture; name them with --ranks")
        ranks, reason = targets.ranks, targets.reason
    used = captures_bytes(args.dir)
    if used >= max_bytes:
        raise MeshprofError(
            f"the captures already take {used:,} bytes, over --max-bytes {args.max_bytes}: "
            "remove old ones from RUN_DIR/captures or raise the budget"
        )
    for r in ranks:
        x = snap.ranks.get(r)
        if x is None or r in snap.stale or x.status != "running":
            state = "no live state" if x is None else "stale" if r in snap.stale else x.status
            print(
                f"meshprof capture: warning: rank {r} looks {state}: it may not answer",
                file=sys.stderr,
            )
    if timeout is None:
        step_ns = max((snap.ranks[r].step_ns for r in ranks if r in snap.ranks), default=0)
        timeout = default_timeout(steps, step_ns)
    req = CaptureRequest(
        id=new_request_id(),
        ranks=ranks,
        steps=steps,
        activities=activities,
        record_shapes=args.record_shapes,
        with_stack=args.with_stack,
        trigger="demand",
        reason=reason,
        requested_ns=time.time_ns(),
        timeout_s=timeout,
        max_bytes=max_bytes,
    )
    print(
        f"meshprof capture {req.id}: asking rank(s) {', '.join(map(str, ranks))} for {steps} "
        f"step(s) (timeout {timeout:.0f} s; {reason})",
        file=sys.stderr,
    )

    def progress(st: CaptureRankStatus) -> None:
        first = f" from step {st.steps[0].step}" if st.steps else ""
        print(f"  rank {st.rank}: {st.state}{first}", file=sys.stderr)

    comp = run_capture(args.dir, req, progress)
    if args.json:
        print(json.dumps(to_json(comp)))
    else:
        print(capture_text(comp))
    if comp.state == "empty":
        print(f"meshprof capture: error: {comp.message}", file=sys.stderr)
        return 2
    return 0
