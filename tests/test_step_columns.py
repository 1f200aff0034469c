"""The columnar step analysis (all steps at once) against its one-step forms, and the compact
pickling of its result: the same figures bit for bit, on randomized ranks
(``benchmarks/rank_analysis_cost.py``'s corpus: pipeline chunks, nested phases, unmeasured
CPU time, unknown groups, warm-up and skipped steps)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np

from meshprof.analyze.steps import analyze_recorded, build_timeline
from meshprof.analyze.steps.ledger import CAUSES, step_ledger, step_parts
from meshprof.analyze.steps.timeline import PhaseSpan, StepSpan, StepTimeline
from meshprof.analyze.steps.types import Distribution, StepAnalysis, StepRow, updated

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from rank_analysis_cost import canonical, fuzz_case

SEEDS = range(300)


def _spans(t: StepTimeline) -> list[StepSpan]:
    """The timeline's steps one by one, as the live ledger measures them."""
    ph, st = t.phases, t.steps
    out = []
    for k in range(t.count):
        mine = np.flatnonzero(ph.step_index == k).tolist()
        phases = tuple(
            PhaseSpan(
                ph.names[int(ph.name[i])],
                int(ph.start_ns[i]),
                int(ph.duration_ns[i]),
                int(ph.cpu_ns[i]),
                int(ph.depth[i]),
                bool(ph.is_fb[i]),
                bool(ph.is_chunk[i]),
                int(ph.comm_ns[i]),
                tuple(ph.comm_by_dim[:, i].tolist()) if ph.depth[i] == 1 else (),
                int(ph.tp_ns[i]),
            )
            for i in mine
        )
        out.append(
            StepSpan(
                int(st.step[k]),
                int(st.start_ns[k]),
                int(st.duration_ns[k]),
                int(st.cpu_ns[k]),
                int(st.tokens[k]),
                int(st.samples[k]),
                int(st.comm_ns[k]),
                tuple(st.comm_by_dim[:, k].tolist()),
                tuple(st.count_by_dim[:, k].tolist()),
                tuple(st.bytes_by_dim[:, k].tolist()),
                phases,
            )
        )
    return out


def test_the_steps_parts_are_each_steps_ledger():
    """Row k of :func:`step_parts` (all steps at once) is :func:`step_ledger` of step k alone,
    float for float; and the parts sum to the step."""
    checked = 0
    for seed in SEEDS:
        sp, names, ev, groups, mem, o = fuzz_case(seed)
        t = build_timeline(sp, names, ev, groups, mem, o.layout, o.warmup_steps, o.skip_steps)
        parts = step_parts(t)
        for k, st in enumerate(_spans(t)):
            one = step_ledger(st, t.dimensions)
            assert list(one) == list(CAUSES)
            assert [v.hex() for v in one.values()] == [v.hex() for v in parts[k].tolist()]
            checked += 1
    assert checked > 500


def test_distribution_of_rows_is_of_each_row():
    rng = np.random.default_rng(4)
    for trial in range(300):
        k, n = int(rng.integers(1, 8)), int(rng.integers(1, 300))
        m = rng.exponential(1e7, (k, n)) * 10.0 ** rng.integers(0, 6)
        if trial % 2:
            m = m.round()
        assert Distribution.of_rows(m) == [Distribution.of(row.tolist()) for row in m]
    assert np.isnan(Distribution.of_rows(np.asarray([[1.0, np.nan]]))[0].p95_ns)


def test_an_analysis_pickles_to_the_same_and_makes_its_rows_when_read():
    for seed in SEEDS:
        a = analyze_recorded(*fuzz_case(seed))
        back = pickle.loads(pickle.dumps(a))
        again = pickle.loads(pickle.dumps(back))  # re-pickled before its rows were read
        assert canonical(back) == canonical(a) == canonical(again)
        assert back.to_dict() == a.to_dict()  # (== is False where a figure is NaN)
        assert all(type(r) is StepRow for r in back.per_step)
        assert updated(pickle.loads(pickle.dumps(a)), ledger={}).per_step == a.per_step


def test_rows_that_do_not_pack_pickle_as_they_are():
    a = analyze_recorded(*fuzz_case(3))
    odd = updated(
        a, per_step=[StepRow(1, 2, 3, 4, 5, 6, 7, 8), StepRow(1, 2**70, 3, 4, 5, 6, 7, 8)]
    )
    assert pickle.loads(pickle.dumps(odd)).per_step == odd.per_step
    float_rows = updated(a, per_step=[StepRow(1, 2.5, 3, 4, 5, 6, 7, 8)])  # type: ignore[arg-type]
    assert pickle.loads(pickle.dumps(float_rows)).per_step[0].duration_ns == 2.5
    assert isinstance(odd, StepAnalysis) and not hasattr(odd, "no_such_field")
