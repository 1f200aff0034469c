"""What the request API costs the serving thread, in CPU time per token, side by side, and that
memory and disk stay bounded over a long serving run (issue 40).

* per token: a decode loop over a batch of running requests (B requests, one token each per
  step; each request begun, scheduled and finished at its own length) with the API's calls
  (``begin``, ``scheduled``, ``tokens`` once per step, ``finish``) vs the same loop without them,
  paired batches alternated in one process, on the calling thread's CPU clock; the difference
  divided by the tokens emitted. Also ``token()`` one request at a time (no batching).
* traceparent (``--only trace``): ``begin`` + ``finish`` of ``--requests`` requests with a
  W3C ``traceparent`` each (distinct made-up headers, as a server receives them) vs the same
  requests without, rounds alternated, on the thread's CPU clock: what a traced request adds
  per request (the parse at ``begin``, the trace row at ``finish``).
* long run: ``--tokens`` tokens (10 M by default: about a week of one serving rank at 16
  tokens/s) through a request monitor while a rank writer appends them every tick to a run
  directory with ``--max-disk``, and the live publisher's figures folded every tick: the
  process' RSS growth and the rank folder's size at the end, against the bound.

    python benchmarks/request_api_cost.py [--steps 2000] [--batch 16] [--rounds 11]
                                          [--tokens 10000000] [--max-disk 64M]
                                          [--requests 20000] [--only token,trace,long]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def _loop(
    steps: int,
    batch: int,
    rm: object | None,
    lengths: list[int],
    running: dict[int, list[int]] | None = None,
) -> tuple[int, int]:
    """A decode loop of ``steps`` steps over ``batch`` running requests (``running``: id ->
    [tokens left], carried from one call to the next); (CPU ns, tokens)."""
    running = {} if running is None else running
    next_id = max(running, default=-1) + 1
    tokens = 0
    t0 = time.thread_time_ns()
    for s in range(steps):
        while len(running) < batch:  # admit new requests (their prefill is this step)
            if rm is not None:
                rid = rm.begin(32)  # type: ignore[attr-defined]
                rm.scheduled(rid)  # type: ignore[attr-defined]
            else:
                rid = next_id
            next_id += 1
            running[rid] = [lengths[(next_id + s) % len(lengths)]]
        ids = list(running)
        if rm is not None:
            rm.tokens(ids)  # type: ignore[attr-defined]
        tokens += len(ids)
        for rid in ids:
            left = running[rid]
            left[0] -= 1
            if left[0] <= 0:
                del running[rid]
                if rm is not None:
                    rm.finish(rid, "length")  # type: ignore[attr-defined]
    return time.thread_time_ns() - t0, tokens


def _single(n: int, rm: object | None) -> int:
    """``n`` tokens of one request, one ``token()`` call each; CPU ns."""
    rid = rm.begin(8) if rm is not None else 0  # type: ignore[attr-defined]
    t0 = time.thread_time_ns()
    for _ in range(n):
        if rm is not None:
            rm.token(rid)  # type: ignore[attr-defined]
    dt = time.thread_time_ns() - t0
    if rm is not None:
        rm.finish(rid)  # type: ignore[attr-defined]
    return dt


def per_token(steps: int, batch: int, rounds: int) -> None:
    from meshprof.monitor.request_monitor import RequestMonitor

    lengths = [16, 64, 128, 256, 32, 512]
    diffs, base, single = [], [], []
    for r in range(rounds):
        rm = RequestMonitor()
        order = (None, rm) if r % 2 == 0 else (rm, None)
        got = {}
        for who in order:
            got[who is None] = _loop(steps, batch, who, lengths)
        (cpu_off, n), (cpu_on, _) = got[True], got[False]
        base.append(cpu_off / n)
        diffs.append((cpu_on - cpu_off) / n)
        single.append((_single(n, RequestMonitor()) - _single(n, None)) / n)
    diffs.sort()
    lo, hi = diffs[max(len(diffs) // 2 - 2, 0)], diffs[min(len(diffs) // 2 + 2, len(diffs) - 1)]
    print(
        f"batched (tokens() per step, batch {batch}, {steps} steps, {rounds} rounds): loop "
        f"{statistics.median(base):.0f} ns/token without the API; the API adds "
        f"{statistics.median(diffs):.0f} ns/token (middle rounds {lo:.0f}-{hi:.0f})"
    )
    print(
        f"one request at a time (token() per token): adds {statistics.median(single):.0f} ns/token"
    )


def _requests(headers: list[str | None]) -> int:
    """``begin`` + ``finish`` of one request per header, on a fresh monitor; CPU ns."""
    from meshprof.monitor.request_monitor import RequestMonitor

    rm = RequestMonitor()
    begin, finish = rm.begin, rm.finish
    t0 = time.thread_time_ns()
    for h in headers:
        finish(begin(8, traceparent=h))
    return time.thread_time_ns() - t0


def per_request_trace(requests: int, rounds: int) -> None:
    import secrets

    traced: list[str | None] = [
        f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01" for _ in range(requests)
    ]
    plain: list[str | None] = [None] * requests
    diffs, base = [], []
    for r in range(rounds):
        order = (plain, traced) if r % 2 == 0 else (traced, plain)
        got = {id(h): _requests(h) for h in order}
        base.append(got[id(plain)] / requests)
        diffs.append((got[id(traced)] - got[id(plain)]) / requests)
    diffs.sort()
    lo, hi = diffs[max(len(diffs) // 2 - 2, 0)], diffs[min(len(diffs) // 2 + 2, len(diffs) - 1)]
    print(
        f"traceparent ({requests} requests, {rounds} rounds): begin+finish "
        f"{statistics.median(base):.0f} ns/request without; a traceparent adds "
        f"{statistics.median(diffs):.0f} ns/request (middle rounds {lo:.0f}-{hi:.0f})"
    )


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def long_run(tokens: int, batch: int, max_disk: int) -> None:
    import meshprof
    from meshprof.monitor.request_monitor import RequestMonitor
    from meshprof.rundir.segment_writer import StorageLimits
    from meshprof.rundir.writer import RankWriter
    from meshprof.session.live_serving import LiveServing

    run = Path(tempfile.mkdtemp(prefix="meshprof-request-cost-"))
    prof = meshprof.enable()
    rm = RequestMonitor()
    limits = StorageLimits(max_disk_bytes=max_disk, segment_bytes=max(max_disk // 8, 1 << 16))
    writer = RankWriter(run, prof, None, rank=0, tick_s=0, limits=limits)
    live = LiveServing()
    steps_per_tick = 512
    lengths = [16, 64, 128, 256, 32, 512]
    done = 0
    running: dict[int, list[int]] = {}
    t0 = time.monotonic()
    marks = [tokens * (i + 1) // 5 for i in range(5)]
    seen: list[str] = []
    while done < tokens:
        _, n = _loop(steps_per_tick, batch, rm, lengths, running)
        done += n
        writer.tick()
        live.fold(rm)
        live.build(rm, time.time_ns())
        if marks and done >= marks[0]:
            marks.pop(0)
            size = sum(p.stat().st_size for p in (run / "rank00000").iterdir())
            seen.append(
                f"{done / 1e6:.1f}M: RSS {_rss() / 2**20:.0f} MiB, disk {size / 2**20:.0f} MiB"
            )
    writer.write(final=True)
    size = sum(p.stat().st_size for p in (run / "rank00000").iterdir())
    rotated = writer.store.rotated_segments if writer.store else 0
    print(
        f"long run: {done:,} tokens ({rm.finished:,} requests, {len(rm._states)} in flight) in {time.monotonic() - t0:.0f} s "
        f"(--max-disk {max_disk / 2**20:.0f} MiB, {rotated} segments rotated out, rank folder "
        f"{size / 2**20:.1f} MiB at the end): " + "; ".join(seen)
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--tokens", type=int, default=10_000_000)
    p.add_argument("--max-disk", default="64M")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--only", default="token,trace,long")
    a = p.parse_args()
    from meshprof.rundir.sampling import parse_bytes

    only = set(a.only.split(","))
    print(f"pid {os.getpid()}; CPU time of the calling thread (machine possibly shared)")
    if "token" in only:
        per_token(a.steps, a.batch, a.rounds)
    if "trace" in only:
        per_request_trace(a.requests, a.rounds)
    if "long" in only:
        long_run(a.tokens, a.batch, parse_bytes(a.max_disk))


if __name__ == "__main__":
    main()
