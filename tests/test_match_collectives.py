"""Matching collectives across ranks: skew, last rank and waits against the injected delay."""

from __future__ import annotations

import numpy as np

from data.meshprof_synth import MS, US, events_array, memory_array, spans_array, synthetic_run
from meshprof.analyze.run.events.clock import align_clocks
from meshprof.analyze.run.events.match import arrived_last_share, match_collectives, summarize_match
from meshprof.analyze.run.events.table import build_event_table
from meshprof.events import OP_CODES
from meshprof.layout import dimension_of
from meshprof.rundir import RankData, RankMeta, load_run, write_rank_file


def test_skew_last_rank_and_waits(tmp_path):
    extra = 8 * MS
    truth = synthetic_run(
        tmp_path, 4, [0, 35 * MS, -52 * MS, 18 * MS], slow_rank=2, extra_ns=extra, steps=5
    )
    run = load_run(tmp_path)
    t = build_event_table(run)
    m = match_collectives(t, align_clocks(run, t))
    assert len(m) == 5 and m.complete.all() and (m.present == 4).all()
    assert (m.last_rank == 2).all()
    # oracle: the true arrivals of the synthetic timeline (clock error is a few µs)
    arr = truth["arrivals"]
    true_skew = np.array(
        [max(arr[(r, k)] for r in range(4)) - min(arr[(r, k)] for r in range(4)) for k in range(5)]
    )
    assert np.all(np.abs(m.skew_ns - true_skew) < 50 * US)
    assert np.all(true_skew > extra - 300 * US)
    w = m.member_wait_ns
    assert np.all(w[m.member_rank == 2] == 0)
    for i in np.nonzero(m.member_rank != 2)[0]:
        r, k = int(m.member_rank[i]), int(m.seq[m.member_coll[i]])
        assert abs(w[i] - (arr[(2, k)] - arr[(r, k)])) < 50 * US
    share = arrived_last_share(m)
    assert share[2] == (5, 5) and share[0] == (0, 5)
    s = summarize_match(m)
    assert s.incomplete == 0 and abs(s.skew_p50_ns - np.median(true_skew)) < 50 * US


def test_missing_member_is_incomplete_and_p2p_pairs(tmp_path):
    groups = [{"name": "g0", "desc": "default_pg", "ranks": [0, 1, 2], "backend": "gloo"}]
    base = 10**18
    ar, send, recv = OP_CODES["all_reduce"], OP_CODES["send"], OP_CODES["recv"]
    rows = {
        0: [
            (ar, 0, 0, 0, 0, -1, 0, 64, 64, base, 1000, 0),
            (send, 0, 0, 0, 0, 1, 0, 64, 64, base + 5000, 100, 0),
            (send, 0, 0, 0, 0, 1, 1, 64, 64, base + 7000, 100, 0),
        ],
        1: [
            (ar, 0, 0, 0, 0, -1, 0, 64, 64, base + 300, 700, 0),
            (recv, 0, 0, 0, 0, 0, 0, 64, 64, base + 4000, 1200, 0),
            (recv, 0, 0, 0, 0, 0, 1, 64, 64, base + 6000, 1200, 0),
            (recv, 0, 0, 0, 0, 0, 2, 64, 64, base + 9000, 50, 0),
        ],
    }
    for r, ev in rows.items():
        meta = RankMeta(rank=r, world_size=3, groups=groups, span_names=[])
        write_rank_file(
            tmp_path, RankData(r, events_array(ev), spans_array([]), memory_array([]), meta)
        )
    run = load_run(tmp_path)
    assert 2 in run.problems
    t = build_event_table(run)
    m = match_collectives(t, align_clocks(run, t))
    assert len(m) == 1 and m.present[0] == 2 and m.expected[0] == 3 and not m.complete[0]
    assert m.skew_ns[0] == 300 and m.last_rank[0] == 1
    assert len(m.p2p_send_row) == 2 and m.unmatched_p2p == 1
    assert set(t.seq[m.p2p_recv_row].tolist()) == {0, 1}


def test_dimension_from_layout_and_desc():
    layout = {"dp": 2, "tp": 2, "pp": 2}
    # rank = dp*4 + tp*2 + pp
    assert dimension_of((0, 4), layout) == "dp"
    assert dimension_of((0, 2), layout) == "tp"
    assert dimension_of((2, 3), layout) == "pp"
    assert dimension_of(tuple(range(8)), layout) == "world"
    assert dimension_of((0, 1), None, "mesh_tp") == "tp"
    assert dimension_of((0, 1), None, "default_pg") == "other"
