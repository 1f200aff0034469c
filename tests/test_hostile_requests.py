"""Requests posted by someone else (issue 39): whoever can write a run directory can post a
capture or stacks request, so the ranks take one only as a name inside the directory, from the
job's user, within the job's limits, and say why once when they refuse it.

The truths: the file system itself (what exists outside the run directory after a DDP job saw
the hostile requests, with a valid capture in the same job as the proof that its agents were
serving), the owner a refusal names (``os.geteuid``), the limits given to the agent."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from meshprof.launch.spawn import run_ranks
from meshprof.records.captures import CaptureLimits, CaptureRequest, CaptureState
from meshprof.records.codec import RecordError
from meshprof.records.stacks import StacksRequest
from meshprof.rundir.captures import read_statuses, write_request_copy
from meshprof.rundir.requests import (
    read_refusal,
    refusal_path,
    remove_request,
    requests_dir,
    scan_requests,
    write_request,
)
from meshprof.rundir.stacks import read_rank_stacks

ESCAPE = "../../escaped"
"""An id that climbs from ``RUN/captures/<id>`` (and ``RUN/stacks/<id>``) to ``RUN/../escaped``
(the issue's ``../../../../tmp/x``, aimed at the test's own folder)."""


def _post_raw(run: Path, name: str, body: dict[str, Any]) -> Path:
    """A request file as an attacker writes it: any name that passes, any body."""
    folder = requests_dir(run)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(body))
    return path


def _capture_body(id_: str, ranks: list[int], steps: int = 2, **kw: Any) -> dict[str, Any]:
    return {
        "format": "meshprof-capture/1",
        "kind": "capture",
        "id": id_,
        "ranks": ranks,
        "steps": steps,
        "requested_ns": time.time_ns(),
        "timeout_s": 60.0,
        **kw,
    }


def _stacks_body(id_: str) -> dict[str, Any]:
    return {
        "format": "meshprof-stacks/1",
        "kind": "stacks",
        "id": id_,
        "requested_ns": time.time_ns(),
        "timeout_s": 60.0,
    }


def _outside(tmp_path: Path, run: Path) -> list[str]:
    """Every path under ``tmp_path`` that is not in the run directory (the run's own folder
    and the pytest files aside)."""
    out = []
    for p in tmp_path.rglob("*"):
        if run in p.parents or p == run:
            continue
        out.append(str(p.relative_to(tmp_path)))
    return sorted(out)


# -- the reported attack, on a DDP job ---------------------------------------------------------------
def _ddp_rank(rank: int, world_size: int, run_dir: str, good_id: str) -> dict[str, Any]:
    """A DDP job with the capture agent; trains until every rank's part of the valid capture is
    final (its agent served requests all along), at most 40 s."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from meshprof.session.recording import RecordingSession, SessionConfig

    cfg = SessionConfig(run_dir=Path(run_dir), flush_interval_s=0, live_interval_s=0, capture=True)
    session = RecordingSession(cfg).start()
    assert session.capture_agent is not None and session.monitor is not None
    session.capture_agent.poll_s = 0.05
    model = DistributedDataParallel(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    end = time.monotonic() + 40
    state = ""
    while True:
        with session.monitor.step():
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            time.sleep(0.005)
        st = read_statuses(run_dir, good_id).get(rank)
        if st is not None and st.state.final:
            state = str(st.state)
        # the ranks stop together (a rank that left while its peer was in a backward's
        # all_reduce closed the peer's connection under load): when each is final or out of time
        stop = torch.tensor([1 if state or time.monotonic() >= end else 0])
        torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MIN)
        if stop.item():
            break
    session.stop()
    return {"state": state}


@pytest.mark.timeout(180)
def test_a_request_id_that_climbs_out_makes_a_ddp_job_write_nothing_outside(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    _post_raw(run, "capture-evil.json", _capture_body(ESCAPE, [0, 1]))
    _post_raw(run, "stacks-evil.json", _stacks_body(ESCAPE))
    _post_raw(run, "capture-twin.json", _capture_body("other", [0, 1]))  # name and id differ
    good = CaptureRequest(id="good", ranks=(0, 1), steps=2, requested_ns=time.time_ns())
    write_request_copy(run, good)
    write_request(run, good)
    res = run_ranks(_ddp_rank, 2, (str(run), good.id), timeout=150)
    assert [r["state"] for r in res] == ["done", "done"]  # the agents were serving
    assert _outside(tmp_path, run) == []  # nothing escaped
    assert not (run / "captures" / "other").exists()
    reasons = {}
    for name in ("capture-evil.json", "stacks-evil.json", "capture-twin.json"):
        ref = json.loads(refusal_path(run, name).read_text())
        reasons[name] = ref["reason"]
        assert ref["rank"] in (0, 1) and ref["request"] == name
    assert "'../../escaped' is not an id" in reasons["capture-evil.json"]
    assert "'../../escaped' is not an id" in reasons["stacks-evil.json"]
    assert "its id 'other' is not the file's (twin)" in reasons["capture-twin.json"]


def test_the_records_refuse_ids_that_are_paths() -> None:
    for bad in ("..", ".", "../x", "a/b", "/tmp/x", ".hidden", "", "a" * 129, "a\0b", "a b"):
        with pytest.raises(RecordError, match="is not an id"):
            CaptureRequest.from_dict(_capture_body(bad, [0]))
        with pytest.raises(RecordError, match="is not an id"):
            StacksRequest.from_dict(_stacks_body(bad))
    assert CaptureRequest.from_dict(_capture_body("20260101-120000-3fa2", [0])).id
    for body, text in [
        (_capture_body("a", [0], steps=10**9), "steps"),
        (_capture_body("a", [-1]), "not a rank"),
        (_capture_body("a", [2**70]), "not a rank"),
        (_capture_body("a", []), "no rank named"),
        (_capture_body("a", [0], timeout_s=1e308), "timeout_s"),
        (_capture_body("a", [0], activities=["gpu"]), "activities"),
        (_capture_body("a", [0], max_bytes=-5), "max_bytes"),
    ]:
        with pytest.raises(RecordError, match=text):
            CaptureRequest.from_dict(body)


# -- the agent in this process ------------------------------------------------------------------------
class _Host:
    def __init__(self) -> None:
        from meshprof.api import StepMonitor

        self.monitor = StepMonitor(track_pipeline=False)

    def rank(self) -> int:
        return 0


def _agent(run: Path, **limits: Any) -> Any:
    from meshprof.session.capture_agent import CaptureAgent

    return CaptureAgent(run, _Host(), poll_s=0.05, limits=CaptureLimits(**limits))


def _train(agent: Any, until: Any, limit: int = 3000) -> None:
    import torch

    m = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    for _ in range(limit):
        agent.look()
        if until():
            return
        with agent.host.monitor.step():
            m(x).sum().backward()
    raise AssertionError("the agent never got there")


def _final(run: Path, req: CaptureRequest) -> Any:
    return lambda: (st := read_statuses(run, req.id).get(0)) is not None and st.state.final and st


def _links(tmp_path: Path) -> tuple[Path, Path]:
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    run.mkdir()
    return run, outside


@pytest.mark.parametrize("where", ["captures", "captures/c1", "stacks", "requests/refused"])
def test_folders_replaced_by_links_lead_nowhere(tmp_path: Path, where: str) -> None:
    run, outside = _links(tmp_path)
    target = run / where
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(outside, target_is_directory=True)
    agent = _agent(run)
    req = CaptureRequest(id="c1", ranks=(0,), steps=1, requested_ns=time.time_ns())
    write_request(run, req)
    write_request(run, StacksRequest(id="s1", requested_ns=time.time_ns()))
    _post_raw(run, "stacks-bad.json", _stacks_body("../x"))  # a refusal to write
    for _ in range(60):
        agent.look()
        with agent.host.monitor.step():
            pass
    agent.stop()
    assert list(outside.iterdir()) == []
    assert agent.failures + agent.gate.failures > 0  # the write was refused, not made elsewhere


def test_a_link_planted_at_a_file_name_is_replaced_not_followed(tmp_path: Path) -> None:
    run, outside = _links(tmp_path)
    victim = outside / "victim.txt"
    victim.write_text("keep me")
    (run / "stacks" / "s1").mkdir(parents=True)
    (run / "stacks" / "s1" / "rank00000.json").symlink_to(victim)
    agent = _agent(run)
    write_request(run, StacksRequest(id="s1", requested_ns=time.time_ns()))
    agent.look()
    assert victim.read_text() == "keep me"
    assert read_rank_stacks(run, "s1")[0].rank == 0  # the answer is a file of its own


def test_a_request_cannot_lift_the_job_s_limits(tmp_path: Path) -> None:
    run = tmp_path
    agent = _agent(run, max_steps=2, activities=("cpu",), max_per_hour=1, max_bytes=1 << 30)
    too_many = CaptureRequest(id="many", ranks=(0,), steps=3, requested_ns=time.time_ns())
    cuda = CaptureRequest(
        id="cuda", ranks=(0,), steps=1, activities=("cuda",), requested_ns=time.time_ns()
    )
    future = CaptureRequest(id="later", ranks=(0,), steps=1, requested_ns=time.time_ns() + 10**13)
    for req in (too_many, cuda, future):
        write_request(run, req)
    agent.look()
    assert "3 steps asked, the job allows 2" in read_refusal(run, too_many).reason
    assert "activity cuda asked, the job allows cpu" in read_refusal(run, cuda).reason
    assert "in the future" in read_refusal(run, future).reason
    assert read_statuses(run, "many") == {} and agent._active is None
    # a request's max_bytes 0 is the job's budget, not "no limit"
    first = CaptureRequest(id="first", ranks=(0,), steps=1, requested_ns=time.time_ns())
    write_request(run, first)
    _train(agent, _final(run, first))
    assert _final(run, first)().state is CaptureState.DONE
    second = CaptureRequest(id="second", ranks=(0,), steps=1, requested_ns=time.time_ns())
    write_request(run, second)
    _train(agent, _final(run, second))
    st = _final(run, second)()
    assert st.state is CaptureState.SKIPPED and "1 captures in the last hour" in st.message
    for req in (too_many, cuda, future, first, second):
        remove_request(run, req)
    tight = _agent(tmp_path, max_bytes=1)
    third = CaptureRequest(id="third", ranks=(0,), steps=1, requested_ns=time.time_ns())
    write_request(run, third)
    tight.look()
    st = read_statuses(run, "third")[0]
    assert st.state is CaptureState.SKIPPED and "disk budget (1 bytes) is spent" in st.message


def test_stacks_requests_are_rate_limited_with_a_reason(tmp_path: Path) -> None:
    agent = _agent(tmp_path, stacks_per_hour=1)
    a = StacksRequest(id="a", requested_ns=time.time_ns())
    b = StacksRequest(id="b", requested_ns=time.time_ns())
    write_request(tmp_path, a)
    agent.look()
    write_request(tmp_path, b)
    os.utime(requests_dir(tmp_path), ns=(1, 1))  # (a change the agent notices on any file system)
    agent.look()
    assert set(read_rank_stacks(tmp_path, "a")) == {0} and read_rank_stacks(tmp_path, "b") == {}
    assert "answered 1 stacks requests in the last hour" in read_refusal(tmp_path, b).reason


def test_another_user_s_request_is_refused_unless_the_job_takes_them(tmp_path: Path) -> None:
    # the file is ours; the agent is told the job runs as another user (no root to chown)
    mine = _agent(tmp_path)
    mine.gate.uid = os.geteuid() + 1
    write_request(tmp_path, StacksRequest(id="x", requested_ns=time.time_ns()))
    mine.look()
    assert read_rank_stacks(tmp_path, "x") == {}
    reason = read_refusal(tmp_path, StacksRequest(id="x", requested_ns=0)).reason
    assert (
        f"({os.geteuid()}), not by the job's user" in reason
        and "--requests-from-any-user" in reason
    )
    anyone = _agent(tmp_path, any_user=True)
    anyone.gate.uid = os.geteuid() + 1
    write_request(tmp_path, StacksRequest(id="y", requested_ns=time.time_ns()))
    anyone.look()
    assert set(read_rank_stacks(tmp_path, "y")) == {0}


def test_a_refusal_is_said_once_and_on_the_asker_s_terminal(cli: Any, tmp_path: Path) -> None:
    from meshprof.records.live import RankLive
    from meshprof.rundir.live import write_rank_live

    write_rank_live(
        tmp_path, RankLive(rank=0, updated_ns=time.time_ns(), interval_s=1.0, world_size=1)
    )
    agent = _agent(tmp_path, stacks_per_hour=0).start()
    try:
        r = cli("stacks", tmp_path, "--timeout", "30")
    finally:
        agent.stop()
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "refused" in line and "stacks request" in line and "requests/refused/stacks-" in line
    assert agent.gate.refused == 1  # once, though the agent looked many times


def test_files_that_are_not_requests_cost_a_bounded_look(tmp_path: Path) -> None:
    folder = requests_dir(tmp_path)
    folder.mkdir()
    (folder / "capture-big.json").write_bytes(b" " * (1 << 20))
    os.mkfifo(folder / "capture-fifo.json")  # reading a FIFO would block the agent
    (folder / "stacks-deep.json").write_text("[" * 100_000)
    (folder / "capture-link.json").symlink_to("/dev/zero")
    for i in range(200):
        (folder / f"stacks-n{i}.json").write_text("{}")
    t0 = time.monotonic()
    got = scan_requests(tmp_path)
    assert time.monotonic() - t0 < 30
    assert len(got) == 64 and all(p.request is None and p.problem for p in got)
    agent = _agent(tmp_path)
    agent.look()
    assert agent.failures == 0


# -- the rank's own files ------------------------------------------------------------------------------
def test_a_rank_folder_replaced_by_a_link_is_not_written_through(tmp_path: Path) -> None:
    from meshprof.api import StepMonitor
    from meshprof.comm.recorder import CommProfiler
    from meshprof.config import ProfilerConfig
    from meshprof.rundir.writer import RankWriter
    from meshprof.session.live_publish import LivePublisher
    from meshprof.session.watchdog import Watchdog

    run, outside = _links(tmp_path)
    for name in ("rank00001", "live", "hang"):
        (run / name).symlink_to(outside, target_is_directory=True)
    prof = CommProfiler(ProfilerConfig(max_events=100))
    mon = StepMonitor(None, profiler=prof, rank=1)
    writer = RankWriter(run, prof, mon, interval_s=0, rank=1)
    with mon.step():
        writer.tick()
    assert writer.store is not None and writer.store.stopped == "OutsideRunDirError"
    live = LivePublisher(run, prof, mon, rank=1)
    assert live.publish() is None and live.failures == 1
    dog = Watchdog(prof, run / "hang", 60.0, within=run)
    with pytest.warns(RuntimeWarning, match="leads outside the run directory"):
        assert dog.dump("signal") is None
    assert list(outside.iterdir()) == []
