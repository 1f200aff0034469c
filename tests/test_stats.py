"""Bandwidth formulas against hand-computed nccl-tests values, and the statistics (exact while
retained, sketch after the ring wraps) against numpy on known durations."""

from __future__ import annotations

import numpy as np
import pytest

from meshprof.comm.recorder import CommProfiler
from meshprof.config import ProfilerConfig
from meshprof.event_log import EventLog
from meshprof.events import EVENT_DTYPE, OP_CODES, GroupInfo, bandwidth_arrays, bandwidth_gbps
from meshprof.stats import Sketch

MB = 1_000_000
MS = 1_000_000  # ns

# (op, n, in_bytes, out_bytes) -> (algbw, busbw) GB/s for a 1 ms op, worked out by hand from
# nccl-tests' PERFORMANCE.md: algbw = S / t, busbw = algbw * factor.
HAND = [
    # all_reduce: S = the buffer; factor 2(n-1)/n
    ("all_reduce", 4, MB, MB, 1.0, 1.5),
    ("all_reduce", 2, MB, MB, 1.0, 1.0),
    ("all_reduce", 8, 2 * MB, 2 * MB, 2.0, 3.5),
    # all_gather: S = gathered output (n x input); factor (n-1)/n
    ("all_gather", 4, MB // 4, MB, 1.0, 0.75),
    ("all_gather", 2, MB, 2 * MB, 2.0, 1.0),
    # reduce_scatter: S = unscattered input; factor (n-1)/n
    ("reduce_scatter", 4, MB, MB // 4, 1.0, 0.75),
    ("reduce_scatter", 8, 8 * MB, MB, 8.0, 7.0),
    # all_to_all: S = whole send buffer; factor (n-1)/n
    ("all_to_all", 4, MB, MB, 1.0, 0.75),
    # broadcast, reduce: S = buffer; factor 1
    ("broadcast", 4, MB, MB, 1.0, 1.0),
    ("reduce", 8, MB, MB, 1.0, 1.0),
    # gather: S = n x per-rank input, also on non-roots (out 0); factor (n-1)/n
    ("gather", 4, MB // 4, MB, 1.0, 0.75),
    ("gather", 4, MB // 4, 0, 1.0, 0.75),
    # scatter: S = n x per-rank output, also on non-roots (in 0); factor (n-1)/n
    ("scatter", 4, MB, MB // 4, 1.0, 0.75),
    ("scatter", 4, 0, MB // 4, 1.0, 0.75),
    # send / recv: S = the message; factor 1
    ("send", 2, MB, 0, 1.0, 1.0),
    ("recv", 2, 0, MB, 1.0, 1.0),
]


@pytest.mark.parametrize(("op", "n", "in_b", "out_b", "alg", "bus"), HAND)
def test_bandwidth_matches_nccl_tests(
    op: str, n: int, in_b: int, out_b: int, alg: float, bus: float
) -> None:
    a, b = bandwidth_gbps(op, in_b, out_b, MS, n)
    assert a == pytest.approx(alg)
    assert b == pytest.approx(bus)
    # the vectorized form used by the statistics agrees
    va, vb = bandwidth_arrays(
        np.array([OP_CODES[op]]), np.array([in_b]), np.array([out_b]), np.array([MS]), np.array([n])
    )
    assert va[0] == pytest.approx(alg) and vb[0] == pytest.approx(bus)


def test_bandwidth_unknown_duration_is_zero() -> None:
    assert bandwidth_gbps("all_reduce", MB, MB, 0, 4) == (0.0, 0.0)
    assert bandwidth_gbps("all_reduce", MB, MB, -1, 4) == (0.0, 0.0)


def _feed(
    prof: CommProfiler, durations: np.ndarray, op: str = "all_reduce", nbytes: int = 4096
) -> None:
    g = prof.log.group_index(GroupInfo("g0", "default_pg", (0, 1, 2, 3), "gloo"))
    d = prof.log.dtype_code("float32")
    for i, dur in enumerate(durations.tolist()):
        prof.log.append(
            (OP_CODES[op], 0, d, 0, g, -1, i, nbytes, nbytes, 10**18 + i, dur, -1, None, None)
        )


def _durations(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.lognormal(mean=11.0, sigma=1.0, size=n)).astype(np.int64) + 1  # ~60 µs, heavy tail


def test_exact_percentiles_while_retained() -> None:
    prof = CommProfiler(ProfilerConfig(max_events=10_000))
    dur = _durations(2_000)
    _feed(prof, dur)
    st = prof.stats()
    (row,) = st.by_op
    assert st.percentiles == "exact" and row.exact_percentiles
    assert row.count == row.timed == 2_000
    assert (
        row.total_ns == int(dur.sum())
        and row.min_ns == int(dur.min())
        and row.max_ns == int(dur.max())
    )
    assert row.mean_ns == pytest.approx(dur.mean())
    p50, p95, p99 = np.percentile(dur, [50, 95, 99])
    assert (row.p50_ns, row.p95_ns, row.p99_ns) == (p50, p95, p99)
    assert row.total_bytes == 2_000 * 4096
    # busbw of all_reduce on 4 ranks: 1.5 x algbw, algbw = 4096 / t
    assert row.mean_algbw_gbps == pytest.approx(np.mean(4096 / dur))
    assert row.mean_busbw_gbps == pytest.approx(1.5 * np.mean(4096 / dur))


def test_sketch_percentiles_after_the_ring_wraps() -> None:
    prof = CommProfiler(ProfilerConfig(max_events=100, sketch_relative_error=0.01))
    dur = _durations(5_000, seed=1)
    _feed(prof, dur)
    st = prof.stats()
    (row,) = st.by_op
    assert st.percentiles == "sketch" and not row.exact_percentiles
    assert len(prof.log) == 100 and prof.log.evicted == 4_900
    # counts and totals stay exact for the whole run
    assert row.count == row.timed == 5_000
    assert (
        row.total_ns == int(dur.sum())
        and row.min_ns == int(dur.min())
        and row.max_ns == int(dur.max())
    )
    # each percentile within the stated relative error of the true order statistic
    for q, est in ((50, row.p50_ns), (95, row.p95_ns), (99, row.p99_ns)):
        true = float(np.percentile(dur, q, method="lower"))
        assert abs(est - true) <= 0.01 * true, (q, est, true)
    # only the newest events are kept, oldest first
    arr, ids = prof.columns()
    assert ids.tolist() == list(range(4_900, 5_000))
    assert arr["duration_ns"].tolist() == dur[-100:].tolist()


def test_sketch_relative_error_bound() -> None:
    rng = np.random.default_rng(3)
    v = rng.integers(1, 10**9, size=20_000)
    for a in (0.01, 0.05):
        s = Sketch(a)
        s.add_many(v)
        for q in (0.01, 0.5, 0.9, 0.99, 0.999):
            true = float(np.sort(v)[int(q * (len(v) - 1))])
            assert abs(s.quantile(q) - true) <= a * true


def test_ring_buffer_eviction_is_constant_time() -> None:
    """Appending to a full ring moves no data: the write position just wraps (O(1) per event)."""
    log = EventLog(8)
    ring = log.ring  # a view taken before any event: it sees the writes only if made in place
    row = np.zeros(1, dtype=EVENT_DTYPE)
    for i in range(20):
        row["seq"] = i
        log.append_chunk(row.copy())
    arr, ids = log.snapshot()
    assert arr["seq"].tolist() == list(range(12, 20))
    assert ids.tolist() == list(range(12, 20))
    # the slot of event i is i % capacity: event 19 overwrote slot 3 in place
    assert ring["seq"][19 % 8] == 19
    assert ring["seq"].tolist() == [16, 17, 18, 19, 12, 13, 14, 15]
    assert not ring.flags.writeable and log.evicted == 12
    rows, first = log.rows_since(15)
    assert first == 15 and rows["seq"].tolist() == [15, 16, 17, 18, 19]


def test_errors_and_groups_per_dimension() -> None:
    prof = CommProfiler(ProfilerConfig())
    g0 = prof.log.group_index(GroupInfo("g0", "default_pg", (0, 1), "gloo"))
    g1 = prof.log.group_index(GroupInfo("g1", "tp", (0, 1, 2, 3), "gloo"))
    d = prof.log.dtype_code("float32")
    rows = [
        ("all_reduce", g0, 1000, 0, 5_000),
        ("all_reduce", g1, 1000, 0, 7_000),
        ("all_reduce", g1, 3000, 1, 9_000),  # failed
        ("broadcast", g0, 100, 0, 2_000),
    ]
    for i, (op, g, nb, status, dur) in enumerate(rows):
        prof.log.append(
            (
                OP_CODES[op],
                status,
                d,
                0,
                g,
                -1,
                i,
                nb,
                nb,
                0,
                dur,
                -1,
                "boom" if status else None,
                None,
            )
        )
    st = prof.stats()
    by_op = {s.key: s for s in st.by_op}
    assert by_op["all_reduce"].count == 3 and by_op["all_reduce"].errors == 1
    assert by_op["all_reduce"].total_bytes == 5000
    by_group = {s.key: s for s in st.by_group}
    assert by_group["g1"].count == 2 and by_group["g1"].total_ns == 16_000
    assert by_group["g0"].count == 2
    by_size = {int(s.key): s.count for s in st.by_size}
    assert by_size == {128: 1, 1024: 2, 4096: 1}
    assert [s.key for s in st.by_rank] == ["0"]
    assert prof.events()[2].error == "boom"


def test_per_rank_and_per_group_tracking_can_be_turned_off():
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import meshprof
    from meshprof.config import ProfilerConfig

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        sub = dist.new_group([0, 1])
        t = torch.ones(8)
        for cfg, groups, ranks in (
            (ProfilerConfig(native=False), 2, 1),  # the Python kernel's completion is waited on
            (ProfilerConfig(native=False, track_per_group=False, track_per_rank=False), 0, 0),
        ):
            meshprof.reset()
            prof = meshprof.enable(cfg)
            for _ in range(3):
                dist.all_reduce(t)
                dist.all_reduce(t, group=sub)
            for w in prof.completion.awaited_works():
                w.wait()
            st = prof.stats()
            assert len(st.by_group) == groups and len(st.by_rank) == ranks
            assert [(s.key, s.count) for s in st.by_op] == [("all_reduce", 6)]
            assert sum(s.count for s in st.by_size) == 6
            meshprof.disable()
    finally:
        dist.destroy_process_group()


def test_native_build_failure_falls_back_to_the_python_recorder(monkeypatch):
    import warnings

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import meshprof
    import meshprof.comm.native
    from meshprof.config import ProfilerConfig
    from meshprof.errors import MeshprofError

    def no_compiler():
        raise MeshprofError("the native recorder could not be built (no compiler)")

    monkeypatch.setattr(meshprof.comm.native, "load", no_compiler)
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            prof = meshprof.enable(ProfilerConfig(native=True))
        assert any("could not be built" in str(w.message) for w in caught)
        assert prof.backend_name == "python"
        dist.all_reduce(torch.ones(4))
        assert [e.op for e in prof.events()] == ["all_reduce"]
    finally:
        meshprof.disable()
        dist.destroy_process_group()


def test_poller_settle_notices_completed_works_without_its_thread() -> None:
    """The final write's sweep: works that completed while the poller thread never ran (a
    starved thread at interpreter exit) are completed by ``settle`` on the caller's thread; a
    work that completes a little later is waited for; one that never completes is left in flight
    after the timeout."""
    import threading
    import time

    from meshprof.comm.completion import PendingOp, Poller

    class Work:
        def __init__(self, done: bool) -> None:
            self.done = done

        def is_completed(self) -> bool:
            return self.done

    ended: list[str] = []
    poller = Poller(lambda rec, end, err: ended.append(rec.op_name))

    def rec(name: str, work: Work) -> tuple[Work, PendingOp]:
        r = PendingOp()
        r.op_name, r.work = name, work
        return work, r

    poller._fast.append(rec("done", Work(True)))  # no poller thread: nobody sweeps but settle
    poller._slow.append(rec("done_slow", Work(True)))
    late = Work(False)
    poller._fast.append(rec("late", late))
    poller.settle(0.0)
    assert sorted(ended) == ["done", "done_slow"] and poller.pending() == 1
    # (started after the first sweep: a loaded machine may pause this thread for 30 ms)
    threading.Timer(0.03, lambda: setattr(late, "done", True)).start()
    poller.settle(2.0)
    assert ended[-1] == "late" and poller.pending() == 0
    poller._fast.append(rec("never", Work(False)))
    t0 = time.monotonic()
    poller.settle(0.05)
    assert 0.05 <= time.monotonic() - t0 < 1.0 and poller.pending() == 1
    assert "never" not in ended


def test_an_events_dict_is_what_dataclasses_asdict_gives_and_shares_nothing() -> None:
    """``CommEvent.to_dict`` (the JSON export's event) builds the dict directly; it must be
    ``dataclasses.asdict``'s (with ``group_ranks`` a list), metadata copied deeply."""
    import dataclasses

    from meshprof.events import CommEvent

    meta = {"bucket": [1, {"params": 3}]}
    e = CommEvent("all_reduce", 1, 4, "0", "default_pg", (0, 1, 2, 3), 7, "float32", MB, MB,
                  5, 2 * MS, 0.5, 0.75, status="pending", metadata=meta, step=3, async_op=True)  # fmt: skip
    for ev in (e, dataclasses.replace(e, metadata={})):
        want = dataclasses.asdict(ev)
        want["group_ranks"] = list(ev.group_ranks)
        assert ev.to_dict() == want and list(ev.to_dict()) == list(want)
    d = e.to_dict()
    d["metadata"]["bucket"][1]["params"] = 9
    assert meta == {"bucket": [1, {"params": 3}]}
