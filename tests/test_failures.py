"""Which ranks failed and which failed first (analyze/failures.py), on hand-built runs with a
known story: the ordering uses the aligned clock, torchrun's SIGTERM of the survivors never
comes first, and the headline the reports lead with says it in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshprof.analyze.run.events.clock import ClockAlignment, RankClock
from meshprof.analyze.run.failures import find_failures, short_reason
from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, SPAN_DTYPE
from meshprof.render.failures import failure_headline
from meshprof.rundir import LoadedRun, Manifest, RankData, RankMeta
from meshprof.rundir.schema import ExitStatus

PEER_GONE = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4"


def _rank(r: int, **meta: object) -> RankData:
    return RankData(
        rank=r,
        events=np.zeros(0, EVENT_DTYPE),
        spans=np.zeros(0, SPAN_DTYPE),
        memory=np.zeros(0, MEMORY_DTYPE),
        meta=RankMeta.from_dict({"rank": r, **meta}),
    )


def _clock(offsets: dict[int, int]) -> ClockAlignment:
    ranks = tuple(
        RankClock(r, off, 0, "exchange", off, 0, None, -1, 0, 0)
        for r, off in sorted(offsets.items())
    )
    return ClockAlignment(0, ranks, 0)


def _run(ranks: dict[int, RankData], manifest: dict[str, object]) -> LoadedRun:
    return LoadedRun(Path("."), Manifest.from_dict(manifest), ranks, {}, 4)


def test_the_killed_rank_comes_first_on_the_aligned_clock() -> None:
    t = 1_000_000_000_000
    ranks = {
        # rank 1: killed, recovered; its last tick 0.3 s before the peers saw the socket close
        1: _rank(1, recovered={"tick_ns": t - 300_000_000, "step": 87, "step_ns": t - 5e8}),
        # rank 0 raised 50 ms after; its clock runs 0.4 s ahead (offset -0.4 s): local time
        # alone would put it after rank 2's SIGTERM, the aligned clock puts it before
        0: _rank(0, current_step=87, exit=ExitStatus("exception", 1, PEER_GONE, t + 450_000_000)),
        2: _rank(2, current_step=87, exit=ExitStatus("signal", 143, "SIGTERM", t + 100_000_000)),
        3: _rank(3, current_step=88, exit=ExitStatus("normal", 0, "", t + 2_000_000_000)),
    }
    run = _run(
        ranks,
        {"status": "failed", "rank_exit_codes": {"0": 1, "1": -9, "2": -15, "3": 0},
         "rank_signals": {"1": "SIGKILL", "2": "SIGTERM"}},
    )  # fmt: skip
    fails = find_failures(run, _clock({0: -400_000_000, 1: 0, 2: 0, 3: 0}))
    assert [(f.rank, f.how, f.exit_code, f.signal, f.last_step, f.first) for f in fails] == [
        (1, "signal", -9, "SIGKILL", 87, True),
        (0, "exception", 1, None, 87, False),
        (2, "signal", -15, "SIGTERM", 87, False),
    ]
    assert fails[0].last_seen_ns == t - 300_000_000 and fails[0].recovered
    assert fails[1].last_seen_ns == t + 50_000_000
    assert failure_headline(fails) == (
        "rank 1 was killed by SIGKILL at step 87; rank 0 then failed (connection closed by peer);"
        " rank 2 then failed (killed by SIGTERM)"
    )


def test_a_rank_with_no_data_and_a_clean_run() -> None:
    ok = {r: _rank(r, exit=ExitStatus("normal", 0, "", 5)) for r in range(4)}
    assert find_failures(_run(ok, {"status": "ok"}), _clock(dict.fromkeys(ok, 0))) == ()
    # a rank that left nothing: torchrun's -9 still names it; one with no word at all is missing
    del ok[2], ok[3]
    run = _run(ok, {"status": "failed", "rank_exit_codes": {"2": -9}})
    fails = find_failures(run, _clock({0: 0, 1: 0}))
    assert [(f.rank, f.how, f.signal, f.last_step, f.last_seen_ns) for f in fails] == [
        (2, "signal", "SIGKILL", None, None),
        (3, "missing", None, None, None),
    ]
    assert fails[0].first  # only consequences: the earliest (by rank when no time) is first
    # a run still going names nobody for lack of an exit record
    run = _run({r: _rank(r) for r in range(4)}, {"status": "running"})
    assert find_failures(run, _clock(dict.fromkeys(range(4), 0))) == ()


def test_short_reasons() -> None:
    assert short_reason(PEER_GONE) == "connection closed by peer"
    assert short_reason("RuntimeError: Connection reset by peer") == "connection reset by peer"
    assert short_reason("ValueError: boom\nmore") == "ValueError: boom"
