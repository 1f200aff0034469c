"""Scale: clock alignment and straggler naming at a few hundred ranks (dp × tp × pp), on synthetic
runs whose truth is known (``benchmarks/synth_run.py``: clocks off by up to ±30 ms, one rank
computing 30 % longer in its forward phase). Small per-rank counts keep it to a few seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from meshprof.analyze.run.events.clock import align_clocks
from meshprof.analyze.run.events.match import match_collectives
from meshprof.analyze.run.events.table import build_event_table
from meshprof.analyze.run.stragglers.stragglers import find_stragglers
from meshprof.rundir import load_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synth_run import write_run

US = 1_000
#: The synthetic collectives complete within 3 µs of each other on every member; alignment
#: chains groups (tp → pp → dp) from rank 0, so a few µs of error per hop is expected. 20 µs is
#: 1,500 times smaller than the offsets.
TOLERANCE_NS = 20 * US


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "collectives-only"])
def test_256_ranks_offsets_recovered_and_slow_rank_named(tmp_path, exchange):
    info = write_run(
        tmp_path,
        256,
        collectives=100,
        steps=5,
        slow_rank=137,
        slow=0.30,
        seed=3,
        layout=(8, 4, 8),
        clock_ms=30,
        exchange=exchange,
    )
    truth = np.asarray(info["aligned_offsets_ns"])
    assert np.abs(truth).max() > 20_000 * US  # tens of ms
    run = load_run(tmp_path)
    assert len(run.ranks) == 256 and not run.problems
    table = build_event_table(run)
    clock = align_clocks(run, table)
    got = np.asarray([rc.offset_ns for rc in clock.ranks])
    assert [rc.rank for rc in clock.ranks] == list(range(256))
    err = np.abs(got - truth)
    assert err.max() <= TOLERANCE_NS, (int(err.argmax()), int(err.max()))
    methods = {rc.method for rc in clock.ranks}
    assert methods == (
        {"reference", "exchange+collectives"} if exchange else {"reference", "collectives"}
    )
    assert clock.max_uncertainty_ns >= 0
    m = match_collectives(table, clock)
    assert m.complete.all()
    s = find_stragglers(run, table, clock, m)
    assert [x.rank for x in s.stragglers] == [137]
    assert s.stragglers[0].phase == "forward"


def test_layouts_of_generator(tmp_path):
    """Any dp × tp × pp (pp even or 1) writes a run whose collectives all match."""
    for i, layout in enumerate([(2, 2, 2), (3, 1, 4), (4, 2, 1)]):
        n = int(np.prod(layout))
        d = tmp_path / str(i)
        info = write_run(d, n, collectives=60, steps=3, seed=i, layout=layout, clock_ms=10)
        assert info["layout"] == layout
        run = load_run(d)
        table = build_event_table(run)
        m = match_collectives(table, align_clocks(run, table))
        assert m.complete.all() and m.unmatched_p2p == 0
        assert len(m.p2p_send_row) == (0 if layout[2] == 1 else int((table.peer >= 0).sum()) // 2)
    with pytest.raises(ValueError):
        write_run(tmp_path / "bad", 12, collectives=10, steps=1, layout=(2, 2, 3))
