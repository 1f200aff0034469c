"""The vectorized analysis helpers give exactly what the plain numpy / loop versions give, and
the merged trace of a long run keeps its last whole steps."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from data.meshprof_synth import MS, synthetic_run
from meshprof.analyze.compute.intervals import Segments, clipped_total
from meshprof.analyze.compute.sorting import (
    equal_runs,
    group_seq_key,
    lexsort2,
    stable_argsort,
    unique_inverse,
)
from meshprof.analyze.run.events.clock import align_clocks
from meshprof.analyze.run.events.match import match_collectives
from meshprof.analyze.run.events.table import build_event_table
from meshprof.render.perfetto import build_trace, write_trace
from meshprof.rundir import load_run


@pytest.mark.parametrize("span", [3, 10**6, 2**40, 2**62])
def test_sorts_match_numpy(span):
    rng = np.random.default_rng(span % 1000)
    for n in (0, 1, 2, 7, 5000):
        a = rng.integers(-span, span, n)
        b = rng.integers(0, 4, n)
        assert (stable_argsort(a) == np.argsort(a, kind="stable")).all()
        assert (lexsort2(a, b) == np.lexsort((a, b))).all()
        assert (lexsort2(b, a) == np.lexsort((b, a))).all()
        u, inv = unique_inverse(a)
        u2, inv2 = np.unique(a, return_inverse=True)
        assert (u == u2).all() and (inv == inv2.reshape(-1)).all()


def test_equal_runs_are_itertools_groupby_runs():
    rng = np.random.default_rng(2)
    for n in (0, 1, 2, 50, 3000):
        k = np.sort(rng.integers(0, max(n // 3, 1), n))
        runs, i = [], 0
        for _v, g in itertools.groupby(k.tolist()):
            m = len(list(g))
            runs.append((i, i + m))
            i += m
        for min_len in (1, 2, 3):
            assert equal_runs(k, min_len) == [(a, b) for a, b in runs if b - a >= min_len]


def test_group_seq_key_orders_and_equals_like_the_pair():
    rng = np.random.default_rng(1)
    g = rng.integers(0, 5, 3000)
    s = rng.integers(-2, 400, 3000)
    k = group_seq_key(g, s)
    pairs = list(zip(g.tolist(), s.tolist(), strict=True))
    order = np.argsort(k, kind="stable")
    assert [pairs[i] for i in order] == sorted(pairs, key=lambda p: p)
    assert len(set(k.tolist())) == len(set(pairs))


def test_segments_equal_a_loop_of_clipped_totals():
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        s = np.sort(rng.integers(0, 1000, n))
        e = s + rng.integers(0, 200, n)
        k = int(rng.integers(1, 6))
        t0 = np.sort(rng.integers(0, 1000, k))
        t1 = t0 + rng.integers(-10, 400, k)  # overlapping and empty steps too
        lo = np.searchsorted(s, t0, side="left")
        hi = np.maximum(np.searchsorted(s, t1, side="left"), lo)
        seg = Segments(s, e, lo, hi, t0)
        sub = rng.random(n) < 0.6
        w = int(rng.integers(0, 12))
        wseg = rng.integers(0, k, w)
        wa = t0[wseg] + rng.integers(-50, 300, w)
        wb = wa + rng.integers(-20, 300, w)
        got = seg.clipped_totals(sub, wseg, wa, wb)
        for i in range(w):
            j = wseg[i]
            m = np.zeros(n, dtype=bool)
            m[lo[j] : hi[j]] = True
            m &= sub
            assert got[i] == clipped_total(s[m], e[m], int(wa[i]), int(wb[i]))


def test_trace_of_a_long_run_keeps_the_last_whole_steps(tmp_path):
    synthetic_run(tmp_path, 3, [0, 5 * MS, -7 * MS], steps=10, slow_rank=2, extra_ns=2 * MS)
    run = load_run(tmp_path)
    t = build_event_table(run)
    clock = align_clocks(run, t)
    m = match_collectives(t, clock)
    full = build_trace(run, t, clock, m, max_events=0)
    assert "truncated" not in full["metadata"]
    assert build_trace(run, t, clock, m) == full  # under the default cap: everything
    cut = build_trace(run, t, clock, m, max_events=7)  # 10 steps x 3 ranks = 30 collectives
    info = cut["metadata"]["truncated"]
    assert info["collectives_total"] == 30 and 0 < info["collectives_kept"] <= 9
    x = [e for e in cut["traceEvents"] if e["ph"] == "X"]
    steps = {e["name"] for e in x if e["cat"] == "step"}
    kept_steps = info["collectives_kept"] // 3
    assert steps == {f"step {k}" for k in range(10 - kept_steps, 10)}
    # every kept step is whole: its spans and collectives on every rank, with their arrows
    assert sum(e["cat"] == "step" for e in x) == 3 * kept_steps
    assert sum(e["cat"] == "phase" for e in x) == 9 * kept_steps
    assert sum(e["cat"] == "comm" for e in x) == 3 * kept_steps
    flows = [e for e in cut["traceEvents"] if e["ph"] in ("s", "f")]
    assert len(flows) == 2 * 2 * kept_steps
    p = write_trace(Path(tmp_path) / "t.json", cut)
    assert json.loads(p.read_text()) == json.loads(json.dumps(cut))


def test_report_cli_trace_cap(tmp_path, cli):
    run_dir = tmp_path / "run"
    synthetic_run(run_dir, 2, [0, 3 * MS], steps=6)
    out = tmp_path / "t.json"
    p = cli("report", run_dir, "--json", "--trace", out, "--trace-max-events", "4")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["summary"]["steps"] == 6  # the report itself is not capped
    meta = json.loads(out.read_text())["metadata"]
    kept = meta["truncated"]["collectives_kept"]
    assert 0 < kept <= 4 and kept % 2 == 0  # whole steps of both ranks, within the cap
    assert meta["truncated"]["max_events"] == 4
    bad = cli("report", run_dir, "--trace", out, "--trace-max-events", "-1")
    assert bad.returncode == 2 and "--trace-max-events" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_linear_percentile_is_numpys_bit_for_bit():
    from meshprof.analyze.steps.types import Distribution, linear_percentile

    rng = np.random.default_rng(7)
    for trial in range(3000):
        n = int(rng.integers(1, 80))
        kind = trial % 4
        if kind == 0:
            v = rng.normal(1e6, 3e5, n)
        elif kind == 1:  # ties
            v = rng.integers(0, 5, n).astype(float) * 1e7
        elif kind == 2:
            v = rng.exponential(1e9, n).round()
        else:
            v = rng.uniform(-1, 1, n) * 10.0 ** rng.integers(-3, 15)
        s = sorted(v.tolist())
        for q in (50, 95, 0, 100, 99, 1, 33.3):
            assert linear_percentile(s, q) == float(np.percentile(v, q)), (v, q)
        d = Distribution.of(v.tolist())
        assert (d.p50_ns, d.p95_ns) == (float(np.percentile(v, 50)), float(np.percentile(v, 95)))
    # not finite: numpy's own path (NaN propagates; inf - inf is NaN there too)
    assert np.isnan(Distribution.of([1.0, float("nan"), 3.0]).p95_ns)
    assert np.isnan(Distribution.of([1.0, float("inf")]).p50_ns)
    assert np.isnan(np.percentile([1.0, float("inf")], 50))


def test_row_means_of_a_matrix_are_each_rows_mean():
    """The step analysis takes every mean over steps from one ``mean(axis=1)`` call: it relies
    on each row of a C-ordered float64 matrix being reduced as that row alone (pairwise)."""
    rng = np.random.default_rng(3)
    for trial in range(500):
        k, n = int(rng.integers(1, 20)), int(rng.integers(1, 400))
        m = rng.normal(1e6, 1e6, (k, n)) * 10.0 ** rng.integers(0, 8)
        if trial % 2:
            m = m.round()
        got = m.mean(axis=1).tolist()
        assert got == [float(np.mean(row.tolist())) for row in m]
