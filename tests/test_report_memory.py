"""The report's allocator hint (``analyze/heap.py``), the what-if's level order on graphs whose
collectives sit at different chain positions (and on a cycle), and the synthetic benchmark run
with a dimension of size 1 (its dp and world slots share group 0's sequence numbers)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from meshprof.analyze.compute import heap
from meshprof.analyze.run.replay.replay import levels
from meshprof.analyze.run.replay.replay_record import Recorded
from meshprof.report.analysis import analyze_run
from meshprof.rundir import load_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synth_run import write_run

from meshprof.report.stages.what_if import WHAT_IF_REPLAY


@pytest.fixture
def fresh_heap(monkeypatch):
    """The helper's looked-up function forgotten before and after the test."""
    monkeypatch.setattr(heap, "_looked", False)
    monkeypatch.setattr(heap, "_trim", None)
    yield heap
    heap._looked, heap._trim = False, None


def test_release_is_a_bool_and_finds_glibc_on_linux(fresh_heap):
    got = fresh_heap.release_free_memory()
    assert isinstance(got, bool)
    import ctypes

    glibc = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    assert (fresh_heap._malloc_trim() is not None) == glibc


def test_release_is_a_no_op_off_linux(fresh_heap, monkeypatch):
    monkeypatch.setattr(fresh_heap.sys, "platform", "darwin")
    assert fresh_heap._malloc_trim() is None
    assert fresh_heap.release_free_memory() is False


def test_release_never_raises(fresh_heap, monkeypatch):
    def broken(_pad: int) -> int:
        raise OSError("no allocator")

    monkeypatch.setattr(fresh_heap, "_looked", True)
    monkeypatch.setattr(fresh_heap, "_trim", broken)
    assert fresh_heap.release_free_memory() is False

    def cdll_fails(*_a, **_k):
        raise OSError("dlopen failed")

    monkeypatch.setattr(fresh_heap, "_looked", False)
    monkeypatch.setattr(fresh_heap.ctypes, "CDLL", cdll_fails)
    assert fresh_heap.release_free_memory() is False


def _recorded(chains: list[list[int]], ncoll: int) -> Recorded:
    """A Recorded whose members are the given chains of collective codes (only the fields
    :func:`levels` reads are meaningful)."""
    coll = np.asarray([c for ch in chains for c in ch], dtype=np.int32)
    pos = np.asarray([i for ch in chains for i in range(len(ch))], dtype=np.int32)
    n, z = len(coll), np.zeros(len(chains), dtype=np.int64)
    zi = np.zeros(n, dtype=np.int64)
    zb = np.zeros(n, dtype=bool)
    const = np.zeros(ncoll, dtype=np.int64)
    return Recorded(zi, coll, const, zb, zi, pos, zi - 1, zi, z, z, z.astype(bool), z)


def _longest_paths(chains: list[list[int]], ncoll: int) -> list[int] | None:
    """Levels by brute force: relax every edge until nothing changes (None after ncoll + 1
    rounds: a cycle)."""
    lvl = [0] * ncoll
    for _ in range(ncoll + 1):
        changed = False
        for ch in chains:
            for a, b in itertools.pairwise(ch):
                if lvl[b] < lvl[a] + 1:
                    lvl[b], changed = lvl[a] + 1, True
        if not changed:
            return lvl
    return None


def test_levels_when_collectives_sit_at_different_positions():
    # a pipeline pair whose first stage runs tensor-parallel collectives (10, 11, 12, shared
    # with its TP peer) between its sends: the send/recv pairs 0..5 sit at different positions
    # on the two stages (each chain is a subsequence of one global order: no cycle)
    chains = [
        [10, 0, 11, 1, 12, 2, 3, 4, 5],
        [0, 1, 2, 13, 3, 4, 5],
        [10, 11, 12],
    ]
    rec = _recorded(chains, 14)
    got = levels(rec)
    assert got is not None
    order, bounds = got
    truth = _longest_paths(chains, 14)
    assert truth is not None and max(truth) == 9  # above the largest position, 8
    lvl_of_member = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    member_lvl = np.empty(len(order), dtype=np.int64)
    member_lvl[order] = lvl_of_member
    assert member_lvl.tolist() == [truth[c] for c in rec.coll.tolist()]
    # members in order of level, then collective
    key = [(member_lvl[i], int(rec.coll[i])) for i in order.tolist()]
    assert key == sorted(key)


def test_levels_of_aligned_chains_are_positions():
    chains = [[0, 1, 2, 3]] * 4 + [[4, 5]] * 2
    _, bounds = levels(_recorded(chains, 6))
    assert np.diff(bounds).tolist() == [6, 6, 4, 4]


@pytest.mark.parametrize(
    "chains",
    [
        [[0, 1], [1, 0]],  # two ranks issue the same two collectives in opposite orders
        [[0, 1, 2], [2, 3], [3, 1]],  # a longer cycle through three ranks
        [[0, 0]],  # one rank recorded the same collective twice in a row
    ],
)
def test_levels_find_a_cycle(chains):
    ncoll = max(max(c) for c in chains) + 1
    assert _longest_paths(chains, ncoll) is None
    assert levels(_recorded(chains, ncoll)) is None


def test_synthetic_run_with_a_dimension_of_size_one_replays(tmp_path):
    # 8 ranks as 1 × 4 × 2: the dp slots run on the world group, beside the world slots; each
    # group's sequence numbers must still be unique on every rank, or the what-if sees a cycle
    info = write_run(
        tmp_path,
        8,
        collectives=2000,
        steps=4,
        slow_rank=2,
        seed=1,
        layout=(1, 4, 2),
        clock_ms=30,
        slow_phases=(1, 2, 3),
    )
    run = load_run(tmp_path, lean=True)
    for rd in run.ranks.values():
        ev = rd.events[rd.events["peer"] < 0]
        key = ev["group"].astype(np.int64) << 40 | ev["seq"].astype(np.int64)
        assert len(np.unique(key)) == len(key)
    rep = analyze_run(run)
    assert rep[WHAT_IF_REPLAY].note == ""
    assert rep[WHAT_IF_REPLAY].levels >= info["events_per_rank"] // 4 - 1
    assert rep[WHAT_IF_REPLAY].ranks[0].rank == 2
