"""Clock alignment: injected offsets of tens of ms are corrected to within 200 µs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from data.meshprof_synth import MS, US, real_worker, shift_rank_file, synthetic_run
from meshprof.analyze.run.events.clock import align_clocks, exchange_estimate
from meshprof.analyze.run.events.table import build_event_table
from meshprof.launch.spawn import run_ranks
from meshprof.records.rank_meta import ClockSync
from meshprof.rundir import load_run

OFFSETS = [0, 35 * MS, -52 * MS, 18 * MS]


def _max_error(tmp_path, truth, clock) -> int:
    run = load_run(tmp_path)
    worst = 0
    for r, rd in run.ranks.items():
        for e in rd.events:
            aligned = int(e["start_ns"]) + clock.offset(r)
            worst = max(worst, abs(aligned - truth["arrivals"][(r, int(e["seq"]))]))
    return worst


@pytest.mark.parametrize(
    "exchange", [True, False], ids=["exchange+collectives", "collectives-only"]
)
def test_synthetic_offsets_corrected_within_200us(tmp_path, exchange):
    truth = synthetic_run(tmp_path, 4, OFFSETS, exchange=exchange, seed=3)
    run = load_run(tmp_path)
    clock = align_clocks(run, build_event_table(run))
    for rc in clock.ranks:
        assert abs(rc.offset_ns + OFFSETS[rc.rank]) < 200 * US, rc
        assert rc.uncertainty_ns < 200 * US
    assert _max_error(tmp_path, truth, clock) < 200 * US
    assert clock.ranks[1].method == ("exchange+collectives" if exchange else "collectives")


def test_exchange_only_bound_holds(tmp_path):
    """Without shared synchronizing collectives the min-RTT sample decides; the true offset lies
    within the reported ±RTT/2."""
    rng = np.random.default_rng(7)
    true_off = 41 * MS  # rank clock reads 41 ms late
    samples = []
    t = 10**18
    for _ in range(20):
        d1, d2 = int(rng.integers(20 * US, 900 * US)), int(rng.integers(20 * US, 900 * US))
        samples.append([t + true_off, t + d1, t + d1 + d2 + true_off])
        t += 5 * MS
    off, rtt = exchange_estimate(ClockSync(samples=samples))
    assert rtt == min(s[2] - s[0] for s in samples)
    assert abs(off - (-true_off)) <= rtt // 2 + 1
    assert exchange_estimate(ClockSync(samples=[])) is None
    assert exchange_estimate(None) is None


def test_real_run_shifted_rank_is_realigned(tmp_path):
    """A real 2-rank gloo run (one machine: true offset 0); rank 1's timestamps are then shifted by
    +37 ms; alignment must find −37 ms within 200 µs."""
    res = run_ranks(real_worker, 2, (str(tmp_path), -1, 0.0, 4), timeout=90)
    assert res[1]["sync_error"] == "" and res[1]["samples"] == 20
    run = load_run(tmp_path)
    before = align_clocks(run, build_event_table(run))
    # within 200 µs, or within twice the uncertainty the alignment states (a loaded machine
    # widens the exchange's round trips; the stated bound must still hold)
    assert abs(before.offset(1)) < max(200 * US, 2 * before.max_uncertainty_ns)
    # the exchange's ping-pong was not recorded as the user's traffic
    assert not (run.ranks[1].events["peer"] >= 0).any()
    shift_rank_file(tmp_path / "rank00001.npz", 37 * MS)
    run = load_run(tmp_path)
    after = align_clocks(run, build_event_table(run))
    assert abs(after.offset(1) - (-37 * MS)) < max(200 * US, 2 * after.max_uncertainty_ns)
    assert 0 <= after.max_uncertainty_ns < 2 * MS
    assert after.ranks[1].collective_samples >= 4


def _shift_timestamps_only(path, shift_ns: int) -> None:
    """The rank's clock stepped after the start-up exchange: its recorded events, spans and
    memory samples read ``shift_ns`` later, its exchange samples do not."""
    from meshprof.rundir import RankData, load_rank_file, write_rank_file

    rd = load_rank_file(path)
    ev, sp, mm = rd.events.copy(), rd.spans.copy(), rd.memory.copy()
    ev["start_ns"] += shift_ns
    sp["start_ns"] += shift_ns
    mm["t_ns"] += shift_ns
    write_rank_file(path.parent, RankData(rd.rank, ev, sp, mm, rd.meta))


def test_clock_stepped_after_exchange_collectives_win(tmp_path):
    """Exchange says 0 ms, the run's collectives say −5 ms: the collectives cover the run, so they
    win and the disagreement is reported."""
    synthetic_run(tmp_path, 2, [0, 0], steps=8, seed=5)
    _shift_timestamps_only(tmp_path / "rank00001.npz", 5 * MS)
    run = load_run(tmp_path)
    rc = align_clocks(run, build_event_table(run)).ranks[1]
    assert rc.method == "collectives"
    assert abs(rc.offset_ns - (-5 * MS)) < 100 * US
    assert abs(rc.exchange_offset_ns) <= rc.exchange_rtt_ns // 2
    assert abs(rc.disagreement_ns - 5 * MS) < 100 * US


@pytest.mark.parametrize("seed", range(6))
def test_few_noisy_collectives_do_not_override_a_tight_exchange(tmp_path, seed):
    """A loaded host: 4 collectives whose completions are seen up to ±400 µs apart, and an
    exchange with a ~60 µs best round trip. Their medians can differ by a few hundred µs without
    either being wrong; the result must stay inside the exchange's causal bound (±RTT/2 around
    its estimate, which holds the true offset of 23 ms whatever the delays)."""
    off = 23 * MS
    synthetic_run(tmp_path, 2, [0, off], steps=4, seed=seed, completion_jitter_ns=400 * US)
    run = load_run(tmp_path)
    rc = align_clocks(run, build_event_table(run)).ranks[1]
    assert rc.method == "exchange+collectives", rc
    assert abs(rc.offset_ns - rc.exchange_offset_ns) <= rc.exchange_rtt_ns // 2, rc
    assert abs(rc.offset_ns + off) <= rc.exchange_rtt_ns, rc
    assert rc.uncertainty_ns <= rc.exchange_rtt_ns // 2, rc


@pytest.mark.parametrize("packed", [True, False], ids=["one-sort", "two-sorts"])
def test_sync_cells_against_a_plain_loop(tmp_path, monkeypatch, packed):
    """The cells clock alignment reads (one per collective and rank, collectives that ≥ 2 ranks
    recorded, in (group, seq, rank) order) against a dictionary built row by row; both the
    packed single sort and the two-sort fallback (keys too wide for one int64)."""
    import sys
    from pathlib import Path

    from meshprof.analyze.run.events import clock

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_run import write_run

    write_run(tmp_path, 16, 60, 3, slow_rank=5, seed=1, layout=(2, 4, 2), clock_ms=30)
    run = load_run(tmp_path)
    table = build_event_table(run)
    if not packed:
        monkeypatch.setattr(clock, "_PACK_LIMIT", 0)
    ranks = sorted(run.ranks)
    cells = clock._sync_cells(table, ranks)
    sync = {i for i, o in enumerate(table.ops) if o in clock.SYNC_OPS}
    want: dict[tuple[int, int], dict[int, int]] = {}
    for i in range(len(table)):
        if int(table.op[i]) in sync and int(table.peer[i]) < 0:
            cell = want.setdefault((int(table.gid[i]), int(table.seq[i])), {})
            cell.setdefault(
                ranks.index(int(table.rank[i])), int(table.start_ns[i] + table.duration_ns[i])
            )
    want = {k: v for k, v in want.items() if len(v) >= 2}
    got: dict[tuple[int, int], dict[int, int]] = {}
    keys = sorted(want)
    for r, c, e in zip(cells.row.tolist(), cells.col.tolist(), cells.end.tolist(), strict=True):
        got.setdefault(keys[r], {})[c] = int(e) + cells.base
    assert got == want and len(keys) > 50 and len({k[0] for k in keys}) > 5
    # cells in (group, seq, column) order, groups delimited
    order = [
        (keys[r][0], keys[r][1], c)
        for r, c in zip(cells.row.tolist(), cells.col.tolist(), strict=True)
    ]
    assert order == sorted(order)
    gs = cells.group_start.tolist()
    assert gs[0] == 0 and gs[-1] == len(cells.row)
    for a, b in itertools.pairwise(gs):
        assert len({keys[r][0] for r in cells.row[a:b].tolist()}) == 1
