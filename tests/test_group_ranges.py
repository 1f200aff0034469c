"""Rank metas that do not grow with the world size (issue 31): groups as ranges, written by the
real rank writer and read back; old explicit member lists still read as the same groups; a real
gloo run's groups; the point query (``meshprof query DIR --rank R --step S``) against the rank's
own rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from meshprof.comm.recorder import CommProfiler
from meshprof.config import ProfilerConfig
from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, OP_CODES, SPAN_DTYPE, GroupInfo
from meshprof.launch.spawn import run_ranks
from meshprof.records.members import LISTED_UP_TO, Members
from meshprof.records.rank_meta import GroupRecord
from meshprof.rundir import RankData, RankMeta, load_run, write_rank_file
from meshprof.rundir.rank_segments import write_rank_segments
from meshprof.rundir.schema import rank_dir
from meshprof.rundir.segment_reader import load_rank_dir
from meshprof.rundir.writer import RankWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synth_run import write_run


def test_members_are_ranges_and_equal_their_lists() -> None:
    world = Members(range(4096))
    assert world.as_range == range(4096) and len(world) == 4096 and 4095 in world
    assert world == list(range(4096)) and list(range(4096)) == world
    stride = Members([3, 67, 131, 195, 259, 323, 387, 451, 515])  # a dp group: step 64
    assert stride.as_range == range(3, 579, 64)
    assert stride.to_json_data() == {"start": 3, "stop": 579, "step": 64}
    assert Members([5, 1, 2]).as_range is None and Members([5, 1, 2]) == (5, 1, 2)
    small = Members([8, 9, 10, 11])  # listed: no longer than its range
    assert len(small) <= LISTED_UP_TO and small.to_json_data() == [8, 9, 10, 11]
    for m in (world, stride, Members([5, 1, 2]), small, Members([]), Members([7])):
        back = Members.from_json_data(json.loads(json.dumps(m.to_json_data())), "x")
        assert back == m and hash(back) == hash(m) and list(back) == list(m)
    g = GroupRecord(name="0", ranks=list(range(100)))  # a list given in code is made Members
    assert isinstance(g.ranks, Members) and g.to_dict()["ranks"] == {
        "start": 0,
        "stop": 100,
        "step": 1,
    }
    for bad in ({"start": 0}, {"start": 0, "stop": 4, "step": 0}, {"stop": "4"}, "0-4"):
        with pytest.raises(Exception, match="x"):
            Members.from_json_data(bad, "x")


def _meta_bytes(tmp_path: Path, world: int) -> tuple[int, dict]:
    """Rank 5's meta as the real rank writer writes it, in a dp × tp world of ``world`` ranks
    (tp = 8): the world group, its dp group (stride 8) and its tp group."""
    prof = CommProfiler(ProfilerConfig(max_events=100))
    prof.world_size = world
    log = prof.log
    groups = [
        GroupInfo("0", "default_pg", tuple(range(world)), "nccl"),
        GroupInfo("dp5", "mesh_dp", tuple(range(5, world, 8)), "nccl"),
        GroupInfo("tp0", "mesh_tp", tuple(range(0, 8)), "nccl"),
    ]
    dt = log.dtype_code("bfloat16")
    for s, g in enumerate(groups):
        code = log.group_index(g)
        log.append(
            (OP_CODES["all_reduce"], 0, dt, 0, code, -1, s, 64, 64, 1000 * s, 10, 0, None, None)
        )
    w = RankWriter(tmp_path / f"w{world}", prof, None, interval_s=0, rank=5)
    w.write(final=True)
    path = rank_dir(tmp_path / f"w{world}", 5) / "g001-meta.json"
    return path.stat().st_size, json.loads(path.read_text())


def test_rank_meta_is_o_groups_bytes(tmp_path: Path) -> None:
    small, _ = _meta_bytes(tmp_path, 1024)
    big, meta_big = _meta_bytes(tmp_path, 4096)
    assert meta_big["groups"][0]["ranks"] == {"start": 0, "stop": 4096, "step": 1}
    assert meta_big["groups"][1]["ranks"] == {"start": 5, "stop": 4101, "step": 8}
    assert meta_big["groups"][2]["ranks"] == list(range(8))
    # independent of the world size (a few digits more), and small: 4,096 members listed
    # would be ~25 KB for the world group alone
    assert big < 8192 and abs(big - small) < 32, (small, big)
    rd = load_run(tmp_path / "w4096").ranks[5]
    assert rd.groups[0].ranks == list(range(4096)) and rd.groups[1].ranks == range(5, 4096, 8)


def _old_meta(r: int, world: int) -> RankMeta:
    """A meta as versions before issue 31 wrote it: every group's members listed."""
    return RankMeta.from_dict(
        {
            "rank": r,
            "world_size": world,
            "groups": [
                {"name": "0", "desc": "default_pg", "ranks": list(range(world)), "backend": "gloo"},
                {"name": "odd", "desc": "custom", "ranks": [3, 0, 2], "backend": "gloo"},
            ],
            "span_names": ["step"],
        }
    )


def _rows(r: int, steps: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ev = np.zeros(2 * steps, EVENT_DTYPE)
    ev["op"] = OP_CODES["all_reduce"]
    ev["group"] = np.tile([0, 1], steps)
    ev["seq"] = np.repeat(np.arange(steps), 2)
    ev["step"] = np.repeat(np.arange(steps), 2)
    ev["start_ns"] = 10**12 + np.arange(2 * steps) * 1000 + r
    ev["duration_ns"] = 100
    sp = np.zeros(steps, SPAN_DTYPE)
    sp["step"] = np.arange(steps)
    sp["start_ns"] = 10**12 + np.arange(steps) * 2000
    sp["duration_ns"] = 1900
    return ev, sp, np.zeros(0, MEMORY_DTYPE)


def test_old_explicit_lists_load_as_the_same_groups(tmp_path: Path) -> None:
    world = 600  # a long list: parsed once per run and shared (rankfile.parse_meta)
    old_files, old_dirs = tmp_path / "npz", tmp_path / "segments"
    for r in (0, 1, 2, 3):
        ev, sp, mem = _rows(r)
        write_rank_file(old_files, RankData(r, ev, sp, mem, _old_meta(r, world)))
        write_rank_segments(old_dirs, RankData(r, ev, sp, mem, _old_meta(r, world)))
        # the segments' meta as an old writer left it: explicit lists on disk
        p = rank_dir(old_dirs, r) / "g001-meta.json"
        raw = json.loads(p.read_text())
        raw["groups"] = [g.to_dict() | {"ranks": list(g.ranks)} for g in _old_meta(r, world).groups]
        p.write_text(json.dumps(raw))
    assert '"ranks": [0, 1, 2, 3, 4' in (rank_dir(old_dirs, 2) / "g001-meta.json").read_text()
    for d in (old_files, old_dirs):
        for lean in (False, True):
            run = load_run(d, lean=lean)
            assert sorted(run.ranks) == [0, 1, 2, 3]
            worlds = [rd.groups[0].ranks for rd in run.ranks.values()]
            assert all(w is worlds[0] for w in worlds)  # one object for the run
            assert worlds[0] == list(range(world)) and worlds[0].as_range == range(world)
            assert all(rd.groups[1].ranks == [3, 0, 2] for rd in run.ranks.values())
    # the report's groups: sizes from the members, the same either way
    from meshprof.analyze.run.events.table import build_event_table

    sizes = [
        sorted((g.name, len(g.ranks)) for g in build_event_table(load_run(d)).groups)
        for d in (old_files, old_dirs)
    ]
    assert sizes[0] == sizes[1] == [("0", world), ("odd", 3)]


def _gloo_rank(rank: int, world_size: int, run_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from meshprof.session.recording import RecordingSession, SessionConfig

    cfg = SessionConfig(run_dir=Path(run_dir), flush_interval_s=0, layout="dp=2,tp=1,pp=1")
    with RecordingSession(cfg) as session:
        assert session.monitor is not None
        sub = dist.new_group([1, 0])
        for _ in range(2):
            with session.monitor.step():
                dist.all_reduce(torch.ones(4))
                dist.all_reduce(torch.ones(4), group=sub)


@pytest.mark.timeout(120)
def test_a_real_gloo_run_keeps_its_groups(tmp_path: Path, cli) -> None:
    run_ranks(_gloo_rank, 2, (str(tmp_path),), timeout=90)
    run = load_run(tmp_path)
    assert sorted(run.ranks) == [0, 1] and run.problems == {}
    for rd in run.ranks.values():
        members = {g.desc: g.ranks for g in rd.groups}
        assert members["default_pg"] == [0, 1] and isinstance(members["default_pg"], Members)
        assert sorted(len(g.ranks or ()) for g in rd.groups) == [2, 2]
    rep = json.loads(cli("report", str(tmp_path), "--json").stdout)
    assert rep["collectives"]["groups"], rep["collectives"]
    assert {g["size"] for g in rep["collectives"]["groups"]} == {2}


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("synth") / "run"
    write_run(d, 64, steps=20, template="small", layout=(4, 4, 4), slow=1.0, seed=3)
    return d


def test_synthetic_run_is_segments_with_ranges(synth_run: Path) -> None:
    assert not list(synth_run.glob("rank*.npz"))
    meta = json.loads((rank_dir(synth_run, 47) / "g001-meta.json").read_text())
    assert meta["groups"][0]["ranks"] == {"start": 0, "stop": 64, "step": 1}
    assert meta["exit"]["how"] == "normal" and meta["storage"]["events_written"] == 120


def test_point_query_is_the_rank_s_own_rows(synth_run: Path, cli) -> None:
    p = cli("query", synth_run, "--rank", "47", "--step", "12", "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    truth = load_rank_dir(rank_dir(synth_run, 47))  # the rank's rows, read directly
    ev = truth.events[truth.events["step"] == 12]
    assert [e["seq"] for e in got["events"]] == ev["seq"].tolist()
    assert [e["start_ns"] for e in got["events"]] == ev["start_ns"].tolist()
    assert [e["duration_ns"] for e in got["events"]] == ev["duration_ns"].tolist()
    assert [e["index"] for e in got["events"]] == np.flatnonzero(
        truth.events["step"] == 12
    ).tolist()
    assert {e["rank"] for e in got["events"]} == {47} and len(ev) == 6
    step = truth.spans[(truth.spans["kind"] == 0) & (truth.spans["step"] == 12)]
    assert [s["duration_ns"] for s in got["steps"]] == step["duration_ns"].tolist()
    # the same rows as the full load's tables
    full = cli(
        "query",
        synth_run,
        "SELECT seq, start_ns, duration_ns FROM events WHERE rank = 47 AND step = 12 ORDER BY index",
        "--json",
    )
    assert [(e["seq"], e["start_ns"], e["duration_ns"]) for e in got["events"]] == [
        (e["seq"], e["start_ns"], e["duration_ns"]) for e in json.loads(full.stdout)
    ]
    # SQL over the point tables
    sql = cli("query", synth_run, "SELECT count(*) AS n FROM events", "--rank", "47", "--json")
    assert json.loads(sql.stdout) == [{"n": 120}]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--rank", "640", "--step", "1"), "rank 640: not in"),
        (("--rank", "47", "--step", "99"), "step 99: not recorded by rank 47 (its steps: 0-19)"),
        (("--rank", "x"), "expected ranks such as 47"),
        (("SELECT 1", "--step", "3"), "--step needs --rank"),
    ],
)
def test_point_query_bad_input_is_one_line_and_exit_2(synth_run: Path, cli, args, message):
    p = cli("query", synth_run, *args)
    assert p.returncode == 2 and message in p.stderr
    assert len([x for x in p.stderr.splitlines() if x.startswith("meshprof")]) == 1
