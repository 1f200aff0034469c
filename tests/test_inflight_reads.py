"""Every read includes the collectives issued and not completed, marked in flight, once.

A read right after ``backward()`` (``events()``, ``stats()``, ``export_json``, a rank file)
must hold every collective issued so far: those that completed, and those still in flight
(status ``pending``, ``duration_ns`` -1, the issue time), never one of them twice; a later
read has each of the latter completed, once (issue 32).

The oracle is PyTorch's Flight Recorder, which gloo fills with an entry for every collective
it enqueues (meshprof does not compute it): after a read, the FR holds exactly as many new
entries as the read holds collectives, each the same op in the same (group, seq), and an entry
the FR already showed retired (its work finished) before the read must be completed in the
read. On gloo FR's ``state`` stays ``"scheduled"``; ``retired`` turns true some time after the
work finished, so it says "completed" only, never "in flight". gloo runs a reduce_scatter as
an all_reduce (FR's entry) inside a work of its own that completes when a thread waiting on it
wakes: FR retires that all_reduce before, so for reduce_scatter only the counts are checked.

The unit tests make a collective stay in flight without any timing: rank 1 issues its part
only once rank 0 has read (ordered through the process group's store).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from meshprof.launch.spawn import run_ranks
from native_helpers import require_native

WS = 4
ITERS = 50
KINDS = ("events", "export_json", "rank_file", "stats")
"""The reads, one after each backward in turn."""


def _env(mode: str) -> dict[str, str]:
    env = {"TORCH_FR_BUFFER_SIZE": "256", "MESHPROF_NATIVE": "0"}
    if mode == "native":
        require_native()  # built once here, before the ranks start
        env["MESHPROF_NATIVE"] = "1"
    return env


def _fr() -> list[dict[str, Any]]:
    """The Flight Recorder's entries (its pickled dump: the JSON one holds the same entries and
    took 4.5 ms a read here against 1.3 ms, twice per iteration)."""
    import pickle

    import torch

    dump = torch._C._distributed_c10d._dump_fr_trace(True, False, False)
    return list(pickle.loads(dump).get("entries", []))


Key = tuple[str, int]  # (group name, seq)
Op = tuple[Key, str, bool]  # (key, op, in flight)


def _read(prof: Any, kind: str, tmp: Path) -> tuple[int, list[Op] | None, dict[str, int]]:
    """(collectives issued, [(key, op, in flight)] or None for the statistics, in flight by
    op) as one read of ``kind`` returns them."""
    if kind == "events":
        ops = [((e.group_name, e.seq), e.op, e.in_flight) for e in prof.events()]
    elif kind == "export_json":
        data = json.loads(prof.export_json(tmp / "export.json").read_text())
        evs = data["events"]
        ops = [((e["group_name"], e["seq"]), e["op"], e["status"] == "pending") for e in evs]
        assert data["meta"]["inflight_events"] == sum(f for *_, f in ops)
        assert all(e["duration_ns"] == -1 for e in evs if e["status"] == "pending")
    elif kind == "rank_file":
        from meshprof.rundir.rankfile import load_rank_file, write_rank_file
        from meshprof.rundir.writer import rank_data

        rd = load_rank_file(write_rank_file(tmp, rank_data(prof)))
        names = [g.name for g in rd.groups]
        ops = [
            ((names[int(r["group"])], int(r["seq"])), rd.op_name(int(r["op"])), fly)
            for rows, fly in ((rd.events, False), (rd.inflight, True))
            for r in rows
        ]
        assert rd.meta.inflight_events == len(rd.inflight)
        assert (rd.inflight["duration_ns"] == -1).all()
    else:
        st = prof.stats()
        return sum(s.count for s in st.by_op), None, {s.key: s.inflight for s in st.by_op}
    flying = Counter(op for _, op, fly in ops if fly)
    return len(ops), ops, dict(flying)


def _fr_op(entry: dict[str, Any], op: str) -> bool:
    """Whether a Flight Recorder entry is meshprof's ``op``: gloo runs reduce_scatter as an
    all_reduce (its entry), whose work it wraps."""
    name = str(entry["profiling_name"]).removeprefix("gloo:")
    return name == op or (op == "reduce_scatter" and name == "all_reduce")


def _fsdp2(ws: int) -> Any:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (ws,))
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 2))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _ddp(ws: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
    return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)  # a few buckets


def _worker(rank: int, ws: int, iters: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof

    prof = meshprof.enable()
    x = torch.randn(4, 16)
    out: dict[str, Any] = {"problems": [], "seen_inflight": 0, "backend": prof.backend_name}
    problems: list[str] = out["problems"]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, build in (("fsdp2", _fsdp2), ("ddp", _ddp)):
            model = build(ws)
            model(x).sum().backward()  # every group exists and was used once
            dist.barrier()
            prof.settle(10.0)
            base_fr = max(e["record_id"] for e in _fr())
            at_base = prof.events()
            base = len(at_base)
            done = {(e.group_name, e.seq) for e in at_base}
            assert not prof.inflight()
            # (group, seq) of meshprof -> FR's (pg name, collective_seq_id): the offset per group
            last = {}
            for e in at_base:
                last[e.group_name] = max(last.get(e.group_name, -1), e.seq)
            last_fr: dict[str, int] = {}
            for f in _fr():
                pg = f["process_group"][0]
                last_fr[pg] = max(last_fr.get(pg, 0), f["collective_seq_id"])
            offset = {g: last_fr.get(g, 0) - s for g, s in last.items()}
            flying: set[Key] = set()
            for i in range(iters):
                model(x).sum().backward()
                before = _fr()  # what FR showed retired before the read must be completed in it
                kind = KINDS[i % len(KINDS)]
                issued, ops, n_flying = _read(prof, kind, tmp)
                after = _fr()
                out["seen_inflight"] += sum(n_flying.values())
                want = max(e["record_id"] for e in after) - base_fr
                if issued - base != want:
                    problems.append(f"{name} {i} {kind}: {issued - base} issued, FR {want}")
                new = [f for f in before if f["record_id"] > base_fr]
                if ops is None:  # statistics: counts only, per op
                    for op, n in n_flying.items():
                        # (gloo's reduce_scatter: FR retires the all_reduce inside it before
                        # the reduce_scatter's own work returns from wait)
                        live = sum(1 for f in new if _fr_op(f, op) and not f["retired"])
                        if n > live and op != "reduce_scatter":
                            problems.append(f"{name} {i} stats: {n} {op} in flight, FR {live}")
                    continue
                keys = Counter(k for k, *_ in ops)
                twice = [k for k, n in keys.items() if n > 1]
                if twice:
                    problems.append(f"{name} {i} {kind}: twice {twice}")
                fr_of = {(f["process_group"][0], f["collective_seq_id"]): f for f in after}
                retired = {f["record_id"] for f in new if f["retired"]}
                for (g, seq), op, fly in ops:
                    if (g, seq) in done:
                        continue  # completed at an earlier read (checked then)
                    f = fr_of.get((g, seq + offset.get(g, 1)))
                    if f is None:
                        problems.append(f"{name} {i} {kind}: {g}/{seq} {op}: no FR entry")
                        continue
                    if not _fr_op(f, op):
                        problems.append(f"{name} {i} {kind}: {g}/{seq} {op}, FR {f}")
                    # FR says "completed" for an op it records as itself (not reduce_scatter)
                    same = str(f["profiling_name"]).removeprefix("gloo:") == op
                    if fly and same and f["record_id"] in retired:
                        problems.append(f"{name} {i} {kind}: {g}/{seq} in flight, FR retired")
                    if fly:
                        flying.add((g, seq))
                    else:
                        done.add((g, seq))
            dist.barrier()
            prof.settle(10.0)
            # a later read: everything completed, each collective once, what flew among them
            issued, ops, n_flying = _read(prof, "export_json", tmp)
            assert ops is not None
            keys = Counter(k for k, *_ in ops)
            want = max(e["record_id"] for e in _fr()) - base_fr
            if issued - base != want or n_flying or max(keys.values()) > 1:
                problems.append(f"{name} final: {issued - base} vs FR {want}, {n_flying} flying")
            if flying - set(keys):
                problems.append(f"{name} final: never completed {sorted(flying - set(keys))}")
    out["internal_errors"] = prof.internal_errors
    out["first_internal_error"] = prof.first_internal_error
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["native", "python"])
def test_read_after_backward_matches_flight_recorder(mode: str) -> None:
    """FSDP2 then DDP, 50 forward+backward each on 4 ranks, each followed at once by one read
    (events, export, rank file, statistics in turn): meshprof's collectives issued = FR's new
    entries, every time; none that FR shows retired is in flight; a later read completes
    every one that was in flight, once."""
    res = run_ranks(_worker, WS, (ITERS,), timeout=300, pg_timeout_s=60, env=_env(mode))
    for rank, r in enumerate(res):
        assert r["internal_errors"] == 0, r["first_internal_error"]
        assert r["backend"] == mode
        assert r["problems"] == [], f"rank {rank}"


def _held_worker(rank: int, ws: int, run_dir: str) -> dict[str, Any]:
    """Rank 0 issues an all_reduce that cannot complete until rank 1 joins, which it does only
    after rank 0 has read everything; then both read again."""
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.rundir import load_run
    from meshprof.rundir.live import live_file
    from meshprof.rundir.writer import RankWriter
    from meshprof.session.live_publish import LivePublisher
    from meshprof.session.watchdog import build_dump

    prof = meshprof.enable()
    store = dist.distributed_c10d._get_default_store()
    writer = RankWriter(run_dir, prof, interval_s=0, tick_s=0)
    live = LivePublisher(run_dir, prof, interval_s=3600)
    prof.log.listeners.append(live.counters.on_chunk)  # (published by hand: no thread)
    t = torch.ones(8)
    dist.all_reduce(t)  # one completed before
    out: dict[str, Any] = {"backend": prof.backend_name}

    def snapshot(tag: str) -> None:
        evs = prof.events()
        data = json.loads(prof.export_json(Path(run_dir) / f"export{rank}.json").read_text())
        st = prof.stats()
        writer.write(force=True)
        rd = load_run(run_dir).ranks[rank]
        live.publish()
        rec = json.loads(live_file(run_dir, rank).read_text())
        dump = build_dump(prof, "test")
        out[tag] = {
            "events": [(e.op, e.seq, e.status, e.duration_ns) for e in evs],
            "export": [(e["op"], e["seq"], e["status"]) for e in data["events"]],
            "export_inflight": data["meta"]["inflight_events"],
            "stats": [(s.key, s.count, s.timed, s.inflight) for s in st.by_op],
            "summary": prof.summary(),
            "file_events": [int(s) for s in rd.events["seq"]],
            "file_inflight": [(int(s), int(d)) for s, d in rd.inflight[["seq", "duration_ns"]]],
            "file_meta_inflight": rd.meta.inflight_events,
            "file_stats": [
                (r["op"], r["count"], r["timed"], r.get("inflight", 0))
                for r in (rd.meta.stats or {}).get("rows", [])
            ],
            "live": (rec["collectives"], rec["inflight_count"], rec.get("inflight")),
            "live_updated_ns": rec["updated_ns"],
            "dump": (
                [(e["seq"], e["state"]) for e in dump["events"]],
                [o["seq"] for o in dump["inflight"]],
            ),
        }

    # the record takes 200 ms to build after the recorder is read (a loaded host once took 80)
    fill_serving = live._fill_serving

    def slow_fill(*a: Any) -> None:
        time.sleep(0.2)
        fill_serving(*a)

    live._fill_serving = slow_fill  # type: ignore[method-assign]
    if rank == 0:
        before = time.time_ns()
        work = dist.all_reduce(t, async_op=True)
        out["issued_between"] = (before, time.time_ns())
        snapshot("held")
        store.set("read", "1")
        work.wait()
        prof.settle(10.0)
        snapshot("done")
    else:
        store.wait(["read"])
        dist.all_reduce(t)
    dist.barrier()
    live.stop()
    return out


@pytest.mark.parametrize("mode", ["native", "python"])
def test_inflight_op_read_once_then_completed_once(mode: str, tmp_path: Path) -> None:
    """An all_reduce held in flight: every read has it once, pending (events, export, stats,
    summary, the rank file through load_run, the live record, a hang dump); once it completed,
    once, completed, with the counts unchanged."""
    res = run_ranks(_held_worker, 2, (str(tmp_path),), timeout=120, env=_env(mode))
    r = res[0]
    assert r["backend"] == mode
    held, done = r["held"], r["done"]
    # held: seq 0 completed, seq 1 in flight (pending, no duration), each once
    assert [(op, seq, st) for op, seq, st, _d in held["events"]] == [
        ("all_reduce", 0, "ok"),
        ("all_reduce", 1, "pending"),
    ]
    assert held["events"][1][3] == -1
    assert held["export"] == [("all_reduce", 0, "ok"), ("all_reduce", 1, "pending")]
    assert held["export_inflight"] == 1
    assert held["stats"] == [("all_reduce", 2, 1, 1)]  # issued 2, timed 1, in flight 1
    assert "in flight" in held["summary"]
    assert held["file_events"] == [0] and held["file_inflight"] == [(1, -1)]
    assert held["file_meta_inflight"] == 1
    assert held["file_stats"] == [("all_reduce", 2, 1, 1)]
    collectives, inflight_count, oldest = held["live"]
    assert (collectives, inflight_count) == (1, 1) and oldest["seq"] == 1
    # its issue time is when the test issued it (its own clock around the call), and its age is
    # counted to the record's time, however long the record took to build after the read
    lo, hi = r["issued_between"]
    assert lo - 1_000_000 <= oldest["issued_ns"] <= hi + 1_000_000, (oldest, lo, hi)
    assert oldest["issued_ns"] + oldest["age_ns"] == held["live_updated_ns"]
    assert held["dump"] == ([(0, "completed")], [1])
    # done: both completed, each once; nothing in flight; the issued count did not change
    assert [(op, seq, st) for op, seq, st, _d in done["events"]] == [
        ("all_reduce", 0, "ok"),
        ("all_reduce", 1, "ok"),
    ]
    assert all(d >= 0 for *_x, d in done["events"])
    assert done["export"] == [("all_reduce", 0, "ok"), ("all_reduce", 1, "ok")]
    assert done["export_inflight"] == 0
    assert done["stats"] == [("all_reduce", 2, 2, 0)]
    assert "in flight" not in done["summary"]
    assert done["file_events"] == [0, 1] and done["file_inflight"] == []
    assert done["file_stats"] == [("all_reduce", 2, 2, 0)]
    assert done["live"][:2] == (2, 0) and done["live"][2] is None
    assert done["dump"] == ([(0, "completed"), (1, "completed")], [])
