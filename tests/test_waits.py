"""Who waits for whom (``meshprof.analyze.run.stragglers.waits``), against the generator's true arrival
times: each member of a collective waits for the last one to arrive (at most its own duration,
which here always exceeds the skew); the truth charges that to the last rank by the generator's
own clocks (no clock alignment, no matching: its own record of who issued what when)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from data.meshprof_synth import MS, US, synthetic_run
from meshprof.render.html import render_html
from meshprof.report.analysis import analyze_run
from meshprof.report.stages.waits import WAIT_CAUSES
from meshprof.rundir import load_run


def _truth(arrivals: dict[tuple[int, int], int]) -> dict[int, int]:
    """rank -> time the others waited for it, from the true arrivals."""
    by_seq: dict[int, dict[int, int]] = defaultdict(dict)
    for (rank, seq), t in arrivals.items():
        by_seq[seq][rank] = t
    caused: dict[int, int] = defaultdict(int)
    for members in by_seq.values():
        last = max(members, key=lambda r: members[r])
        caused[last] += sum(members[last] - t for r, t in members.items() if r != last)
    return dict(caused)


@pytest.mark.parametrize(
    ("world", "slow", "extra"), [(2, 1, 3 * MS), (4, 2, 2 * MS), (6, 0, 500 * US)]
)
def test_the_slow_rank_is_whom_the_others_wait_for(
    tmp_path: Path, world: int, slow: int, extra: int
) -> None:
    offsets = [(r * 7 - 11) * MS for r in range(world)]  # clocks off by up to tens of ms
    truth = synthetic_run(
        tmp_path,
        world,
        offsets,
        steps=8,
        slow_rank=slow,
        extra_ns=extra,
        collectives=((4096, 1 * MS), (1 << 20, 2 * MS)),
    )
    causes = analyze_run(load_run(tmp_path))[WAIT_CAUSES]
    expected = _truth(truth["arrivals"])
    total = sum(expected.values())
    top = causes[0]
    assert top.rank == slow == max(expected, key=lambda r: expected[r])
    # the clock alignment's error (µs) on each of a few dozen waits
    assert top.caused_ns == pytest.approx(expected[slow], rel=0.02, abs=50 * US)
    assert top.share == pytest.approx(expected[slow] / total, abs=0.02)
    assert top.group == "default_pg" and top.group_ns == top.caused_ns
    assert sum(c.share for c in causes) <= 1 + 1e-9


def test_a_balanced_run_spreads_the_waiting(tmp_path: Path) -> None:
    truth = synthetic_run(tmp_path, 4, [0, 3 * MS, -2 * MS, 5 * MS], steps=8)
    causes = analyze_run(load_run(tmp_path))[WAIT_CAUSES]
    expected = _truth(truth["arrivals"])
    total = sum(expected.values())
    # jitter only (tens of µs): who arrives last is within the clock alignment's error, so the
    # shares are not compared rank by rank; the total is, within that error on every wait
    got_total = sum(c.caused_ns for c in causes)
    waits = 8 * 1 * 3  # steps x collectives x members that wait
    assert abs(got_total - total) <= waits * 20 * US
    assert max(c.share for c in causes) < 0.75


def test_the_html_report_shows_it(tmp_path: Path) -> None:
    synthetic_run(tmp_path, 2, [0, 1 * MS], steps=4, slow_rank=1, extra_ns=2 * MS)
    page = render_html(analyze_run(load_run(tmp_path)))
    assert 'id="who-waits-for-whom"' in page and "share of all waiting" in page
