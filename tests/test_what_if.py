"""What-if attribution (``meshprof.analyze.run.what_if.what_if``): what a slow rank costs every step, proved
against known truth.

Synthetic dp × tp × pp runs (``benchmarks/synth_run.py``) inject an exact extra compute on chosen
ranks in one phase; the truth is the generator's own step ends with and without that injection
(its simulation, not meshprof's replay). A real gloo job sleeps a known time on one rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from data.meshprof_synth import MS, US, events_array, real_worker, spans_array
from meshprof.events import FLAG_ASYNC, OP_CODES
from meshprof.launch.spawn import run_ranks
from meshprof.render.html import render_html
from meshprof.render.report_text import render_report
from meshprof.report.analysis import analyze_run
from meshprof.rundir import Manifest, RankData, RankMeta, load_run, write_manifest, write_rank_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synth_run import groups_for, write_run

from meshprof.report.stages.what_if import WHAT_IF_REPLAY

PHASE = {1: "forward", 2: "backward", 3: "optimizer"}
#: Without jitter the only imbalance is the one injected: the replay must match the generator's
#: step ends up to the clock alignment's error (µs) — 1 % of the injected time + 20 µs.
EXACT_TOL = 0.01
EXACT_ABS_NS = 20 * US


def _truth(tmp: Path, extra: dict[int, int], drop: int, **kw) -> float:
    """The generator's median over steps of (step end with ``extra`` − without rank ``drop``'s
    part of it), for runs that differ only in that injection (same random draws)."""
    with_all = np.asarray(write_run(tmp / "truth_a", extra_ns=extra, **kw)["job_step_end_ns"])
    rest = {r: x for r, x in extra.items() if r != drop}
    without = np.asarray(write_run(tmp / "truth_b", extra_ns=rest, **kw)["job_step_end_ns"])
    return float(np.median(with_all - without))


def _group_of(rank: int, dim: str, n: int, layout: tuple[int, int, int]) -> str:
    groups, _ = groups_for(n, layout)
    return next(g["name"] for g in groups if g["desc"] == f"mesh_{dim}" and rank in g["ranks"])


@pytest.mark.parametrize(
    ("layout", "slow", "phase"),
    [((2, 4, 2), 5, 1), ((4, 4, 2), 22, 2), ((2, 4, 2), 10, 3)],
    ids=["16-forward", "32-backward", "16-optimizer"],
)
def test_one_slow_rank_costs_its_extra_compute(tmp_path, layout, slow, phase):
    n = int(np.prod(layout))
    x = 2 * MS
    kw = dict(
        n=n,
        collectives=240,
        steps=4,
        slow=0.0,
        seed=7,
        layout=layout,
        jitter=False,
        extra_phase=phase,
        clock_ms=5,
    )
    write_run(tmp_path / "run", extra_ns={slow: x}, **kw)
    truth = _truth(tmp_path, {slow: x}, slow, **kw)
    assert abs(truth - x) < 1 * US  # the extra compute is all on the critical path
    w = analyze_run(load_run(tmp_path / "run"))[WHAT_IF_REPLAY]
    assert w is not None and not w.note and w.replay_error_ns == 0
    assert len(w.ranks) == n and w.ranks_total == n  # every rank replayed up to 32
    top = w.ranks[0]
    assert top.rank == slow
    assert abs(top.step_saving_ns - truth) <= EXACT_TOL * truth + EXACT_ABS_NS, top
    assert abs(top.excess_ns - x) <= EXACT_TOL * x + EXACT_ABS_NS, top
    assert top.phase == PHASE[phase]
    assert top.share_of_step == pytest.approx(top.step_saving_ns / w.step_ns)
    for other in w.ranks[1:]:
        assert abs(other.step_saving_ns) <= EXACT_ABS_NS, other
    # where it is paid: the forward and backward gaps precede TP all_reduces (backward also a
    # few DP reduce_scatters and pipeline sends), the optimizer's the DP all_gathers
    dim = "dp" if phase == 3 else "tp"
    assert w.dims[0].dim == dim and w.dims[0].step_saving_ns >= 0.5 * x, w.dims
    assert w.groups[0].group == _group_of(slow, dim, n, layout), w.groups
    assert w.groups[0].step_saving_ns >= 0.5 * x
    others = [g for g in w.groups if slow not in _members(g.group, n, layout)]
    assert all(abs(g.step_saving_ns) <= EXACT_ABS_NS for g in others), others


def _members(name: str, n: int, layout: tuple[int, int, int]) -> list[int]:
    groups, _ = groups_for(n, layout)
    return next(g["ranks"] for g in groups if g["name"] == name)


def test_two_slow_ranks_in_different_replicas(tmp_path):
    # rank 5 (dp replica 0) 3 ms, rank 13 (replica 1, same tp/pp coordinates) 1 ms: the DP
    # collectives wait for the slower replica, so fixing rank 5 saves 3 − 1 ms (rank 13 then
    # gates) and fixing rank 13 saves nothing
    layout = (2, 4, 2)
    extra = {5: 3 * MS, 13: 1 * MS}
    kw = dict(n=16, collectives=240, steps=4, slow=0.0, seed=3, layout=layout, jitter=False)
    write_run(tmp_path / "run", extra_ns=extra, **kw)
    truth5 = _truth(tmp_path, extra, 5, **kw)
    truth13 = _truth(tmp_path, extra, 13, **kw)
    assert abs(truth5 - 2 * MS) < 1 * US and abs(truth13) < 1 * US
    w = analyze_run(load_run(tmp_path / "run"))[WHAT_IF_REPLAY]
    by = {c.rank: c for c in w.ranks}
    assert w.ranks[0].rank == 5
    assert abs(by[5].step_saving_ns - truth5) <= EXACT_TOL * truth5 + EXACT_ABS_NS
    assert by[5].step_saving_ns < by[5].excess_ns - 0.9 * MS  # less than its excess
    assert abs(by[5].excess_ns - 3 * MS) <= EXACT_ABS_NS
    assert abs(by[13].excess_ns - 1 * MS) <= EXACT_ABS_NS
    assert abs(by[13].step_saving_ns - truth13) <= EXACT_ABS_NS
    # both TP groups' imbalance removed at once: the whole 3 ms
    tp = next(d for d in w.dims if d.dim == "tp")
    assert abs(tp.step_saving_ns - 3 * MS) <= EXACT_TOL * 3 * MS + EXACT_ABS_NS


def test_noisy_run_within_noise(tmp_path):
    # with the generator's jitter (gaps ±5 µs per collective, data loading and step tail ±100 µs
    # per rank and step) the peers' median is not the slow rank's own undelayed compute: 5 %
    layout = (4, 4, 2)
    x = 2 * MS
    kw = dict(n=32, collectives=240, steps=5, slow=0.0, seed=11, layout=layout, clock_ms=10)
    write_run(tmp_path / "run", extra_ns={9: x}, **kw)
    truth = _truth(tmp_path, {9: x}, 9, **kw)
    rep = analyze_run(load_run(tmp_path / "run"))
    w = rep[WHAT_IF_REPLAY]
    assert w.ranks[0].rank == 9 and w.ranks[0].phase == "forward"
    assert abs(w.ranks[0].step_saving_ns - truth) <= 0.05 * truth, (w.ranks[0], truth)
    assert all(abs(c.step_saving_ns) < 0.05 * x for c in w.ranks[1:])
    # the report leads with it, in the terminal and in the HTML
    text = render_report(rep)
    lead = text.split("Findings")[0]
    assert "rank 9 costs every step" in lead and "in forward" in lead
    page = render_html(rep)
    assert page.index("rank 9 costs every step") < page.index('id="bottlenecks-and-findings"')


def test_balanced_run_names_nobody(tmp_path):
    write_run(tmp_path, 16, collectives=120, steps=3, slow=0.0, seed=2, layout=(2, 4, 2))
    rep = analyze_run(load_run(tmp_path))
    assert rep[WHAT_IF_REPLAY] is not None and rep[WHAT_IF_REPLAY].notable == ()
    assert "what-if: no rank costs measurably more" in render_report(rep)


@pytest.mark.serial  # a 30 ms sleep against the other causes of a 50 ms step: timing-sensitive
def test_real_gloo_run_sleeping_rank(tmp_path, cli):
    extra_s = 0.03
    run_ranks(real_worker, 3, (str(tmp_path), 1, extra_s, 5), timeout=90)
    d = json.loads(cli("report", tmp_path, "--json").stdout)
    top = d["what_if"][0]
    assert set(top) == {
        "rank", "step_saving_ns", "share_of_step", "phase", "excess_ns", "ci_low_ns", "ci_high_ns",
        "peers",
    }  # fmt: skip
    assert top["ci_low_ns"] > 0 and top["ci_low_ns"] <= top["step_saving_ns"] <= top["ci_high_ns"]
    assert top["rank"] == 1 and top["phase"] == "forward"
    # the sleep, within a loaded machine's oversleep and the ranks' step-start skew
    assert abs(top["step_saving_ns"] - extra_s * 1e9) < 10 * MS, top
    assert 0.2 < top["share_of_step"] < 0.8  # 30 ms of a ~50 ms step
    assert all(abs(x["step_saving_ns"]) < 5 * MS for x in d["what_if"][1:]), d["what_if"]
    assert d["what_if_dims"][0]["step_saving_ns"] > 0.5 * extra_s * 1e9
    info = d["what_if_info"]
    assert info["ranks_replayed"] == 3 and info["steps"] and info["replay_error_ns"] == 0
    text = cli("report", tmp_path, "--full").stdout
    assert "rank 1 costs every step" in text.split("Findings")[0]
    brief = cli("report", tmp_path).stdout  # the verdict leads with it
    assert "1. rank 1 computes longer than its peers" in brief.split("time (")[0], brief


def _overlapped_run(
    out: Path, world: int, slow: int, x: int, steps: int = 4, short: int = -1
) -> None:
    """Each step (starting every 20 ms on every rank): compute 1 ms (+ x on ``slow``), issue
    all_reduce 1, compute 0.5 ms, issue all_reduce 2 while 1 is still in flight; 1 completes
    2 ms after its last arrival, 2 1 ms after its; the step ends 1 ms after both. Rank
    ``short``'s step span ends just before its all_reduce 2 (outside every step there). Both
    are issued async (``FLAG_ASYNC``, as the recorder writes ``async_op=True``): a collective
    recorded blocking is waited for before its rank's next issue."""
    ev: dict[int, list[tuple]] = {r: [] for r in range(world)}
    sp: dict[int, list[tuple]] = {r: [] for r in range(world)}
    for k in range(steps):
        s0 = 10**12 + k * 20 * MS
        i1 = {r: s0 + 1 * MS + (x if r == slow else 0) for r in range(world)}
        i2 = {r: i1[r] + MS // 2 for r in range(world)}
        e1, e2 = max(i1.values()) + 2 * MS, max(i2.values()) + 1 * MS
        end = max(e1, e2) + 1 * MS
        for r in range(world):
            for j, (i, e) in enumerate(((i1[r], e1), (i2[r], e2))):
                ev[r].append(
                    (
                        OP_CODES["all_reduce"],
                        0,
                        0,
                        FLAG_ASYNC,
                        0,
                        -1,
                        2 * k + j,
                        64,
                        64,
                        i,
                        e - i,
                        k,
                    )
                )
            stop = i2[r] - 1 if r == short else end
            sp[r].append((0, 0, 0, 1, k, s0, stop - s0, 0, 0))
            sp[r].append((1, 0, 1, 0, k, s0, i2[r] - s0, 0, 0))
    groups = [{"name": "0", "desc": "default_pg", "ranks": list(range(world)), "backend": "gloo"}]
    for r in range(world):
        meta = RankMeta(rank=r, world_size=world, groups=groups, span_names=["forward", "step"])
        write_rank_file(
            out, RankData(r, events_array(ev[r]), spans_array(sp[r]), np.zeros(0), meta)
        )
    write_manifest(out, Manifest(world_size=world, command="overlapped"))


@pytest.mark.parametrize("short", [-1, 0], ids=["in-steps", "straddling"])
def test_overlapped_collectives(tmp_path, short):
    # all_reduce 2 is issued while 1 is in flight: it depends on the issue of 1, not its end;
    # "straddling": rank 0's all_reduce 2 lies outside its step span (its arrival stays as
    # recorded, its step ends before its all_reduce 1 completes)
    x = 3 * MS
    _overlapped_run(tmp_path, 4, 2, x, short=short)
    w = analyze_run(load_run(tmp_path))[WHAT_IF_REPLAY]
    assert w.replay_error_ns == 0
    assert w.ranks[0].rank == 2 and w.ranks[0].phase == "forward"
    assert w.ranks[0].step_saving_ns == pytest.approx(x, abs=EXACT_ABS_NS)
    assert all(abs(c.step_saving_ns) <= EXACT_ABS_NS for c in w.ranks[1:])


def _crossed_p2p_run(out: Path, slow: int, x: int, steps: int = 4, lead: bool = False) -> None:
    """Two 1F1B-like stage pairs (0 ↔ 1, 2 ↔ 3), each step (every 20 ms): compute 1 ms (+ x on
    ``slow``), then each rank sends to its partner and, 0.1 ms later while the send is in
    flight, receives from it: the pair's two transfers are issued in crossed order (even rank:
    send A, receive B; odd rank: send B, receive A). A transfer completes 0.5 ms after its last
    arrival; the step ends 1 ms after the pair's transfers complete. ``lead``: the odd ranks
    first take part in an all_reduce of their own (0.2 → 0.5 ms), so each pair's transfers
    are released a level after the even rank's arrivals (which then wait for their release)."""
    world = 4
    ev: dict[int, list[tuple]] = {r: [] for r in range(world)}
    sp: dict[int, list[tuple]] = {r: [] for r in range(world)}
    send, recv = OP_CODES["send"], OP_CODES["recv"]
    for k in range(steps):
        s0 = 10**12 + k * 20 * MS
        for a in (0, 2):
            b = a + 1
            i_send = {r: s0 + MS + (x if r == slow else 0) for r in (a, b)}
            i_recv = {r: i_send[r] + MS // 10 for r in (a, b)}
            done_ab = max(i_send[a], i_recv[b]) + MS // 2  # a → b
            done_ba = max(i_send[b], i_recv[a]) + MS // 2  # b → a
            end = max(done_ab, done_ba) + MS
            if lead:
                i_ar = s0 + MS // 5
                ev[b].append(
                    (OP_CODES["all_reduce"], 0, 0, 0, 1, -1, k, 64, 64, i_ar, 3 * MS // 10, k)
                )
            for r, peer, d_send, d_recv in ((a, b, done_ab, done_ba), (b, a, done_ba, done_ab)):
                ev[r].append((send, 0, 0, 1, 0, peer, k, 64, 64, i_send[r], d_send - i_send[r], k))
                ev[r].append((recv, 0, 0, 1, 0, peer, k, 64, 64, i_recv[r], d_recv - i_recv[r], k))
                sp[r].append((0, 0, 0, 1, k, s0, end - s0, 0, 0))
                sp[r].append((1, 0, 1, 0, k, s0, i_send[r] - s0, 0, 0))
    groups = [
        {"name": "0", "desc": "default_pg", "ranks": list(range(world)), "backend": "gloo"},
        {"name": "1", "desc": "odd", "ranks": [1, 3], "backend": "gloo"},
    ]
    for r in range(world):
        meta = RankMeta(rank=r, world_size=world, groups=groups, span_names=["forward", "step"])
        write_rank_file(
            out, RankData(r, events_array(ev[r]), spans_array(sp[r]), np.zeros(0), meta)
        )
    write_manifest(out, Manifest(world_size=world, command="crossed p2p"))


@pytest.mark.parametrize("lead", [False, True], ids=["same-level", "held"])
@pytest.mark.parametrize("engine", ["c", "numpy"])
def test_crossed_async_p2p_is_replayed(tmp_path, monkeypatch, engine, lead):
    """Async sends/receives issued in crossed order (a 1F1B stage pair) are replayed: an
    overlapped event follows its predecessor's issue, not its collective (the collectives'
    graph has the cycle A → B → A there; the levels come from :func:`overlap_levels`). The
    replay reproduces the recorded step ends, and the slow rank costs its extra compute, with
    the C loop available or not (this path runs the two-phase numpy loop either way)."""
    if engine == "numpy":
        monkeypatch.setenv("MESHPROF_REPLAY", "numpy")
    x = 3 * MS
    _crossed_p2p_run(tmp_path, 1, x, lead=lead)
    w = analyze_run(load_run(tmp_path))[WHAT_IF_REPLAY]
    assert w.note == "" and w.replay_error_ns == 0
    assert w.ranks[0].rank == 1 and w.ranks[0].phase == "forward"
    # "held": ranks 1 and 3 issue (all_reduce, send, recv), so rank 1's peer is rank 3 alone:
    # compared with it (not with the mean of the two), it costs its whole extra compute
    assert w.ranks[0].step_saving_ns == pytest.approx(x, abs=EXACT_ABS_NS)
    assert all(abs(c.step_saving_ns) <= EXACT_ABS_NS for c in w.ranks[1:])


def test_overlap_levels_order_crossed_async_and_refuse_a_real_cycle():
    """The two orders of one 1F1B stage pair: rank 0 sends A then receives B, rank 1 sends B
    then receives A. Sends still in flight at the receive (their completion joins no later
    event): A and B share a level, each arrival after its predecessor's. Sends the receive
    waited for (they join the receive) that wait for their receiver: a real deadlock, refused.
    Eager sends (they do not wait for their receiver) that the receive waited for: ordered."""
    from types import SimpleNamespace

    from meshprof.analyze.run.replay.replay_overlap import overlap_levels

    coll = np.asarray([0, 1, 1, 0])  # chain 0: A, B; chain 1: B, A
    pos = np.asarray([0, 1, 0, 1])
    const = np.zeros(2, dtype=np.int64)
    waits = np.ones(4, dtype=bool)
    in_flight = np.asarray([-1, -1, -1, -1])
    rec = SimpleNamespace(coll=coll, pos=pos, const=const, join=in_flight, waits=waits)
    got = overlap_levels(rec)  # type: ignore[arg-type]
    assert got is not None
    order, bounds, arrival = got
    assert list(bounds) == [0, 4]  # one level holds both transfers
    assert sorted(order.tolist()) == [0, 1, 2, 3] and (arrival == 0).all()
    joined = np.asarray([1, -1, 3, -1])
    blocking = SimpleNamespace(coll=coll, pos=pos, const=const, join=joined, waits=waits)
    assert overlap_levels(blocking) is None  # type: ignore[arg-type]
    eager = np.asarray([False, True, False, True])  # the sends do not wait
    ok = SimpleNamespace(coll=coll, pos=pos, const=const, join=joined, waits=eager)
    got = overlap_levels(ok)  # type: ignore[arg-type]
    assert got is not None and list(got[1]) == [0, 4]
