"""`meshprof run` end to end: the real CLI in a subprocess, real torchrun, 2 gloo workers."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

from meshprof.events import OP_NAMES, SPAN_KINDS
from meshprof.rundir import load_run

SCRIPTS = Path(__file__).parent / "scripts"


def op_names(events: np.ndarray) -> list[str]:
    return [OP_NAMES[c] for c in events["op"].tolist()]


@pytest.mark.timeout(180)
def test_run_ddp_script_records_every_collective_and_step(tmp_path: Path, cli) -> None:
    out = tmp_path / "run"
    oracle_dir = tmp_path / "oracle"
    oracle_dir.mkdir()
    p = cli.process(
        "run",
        "--nproc-per-node",
        "2",
        "-o",
        str(out),
        "--json",
        str(SCRIPTS / "run_ddp.py"),
        str(oracle_dir),
        "3",
        env={"TORCH_FR_BUFFER_SIZE": "2000", "MESHPROF_LAYOUT": "dp=2,tp=1,pp=1"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 0 and Path(result["run_dir"]) == out

    run = load_run(out)
    assert sorted(run.ranks) == [0, 1] and run.problems == {}
    m = run.manifest
    assert m["world_size"] == 2 and m["exit_code"] == 0 and m["status"] == "ok"
    assert m["target"] == {
        "kind": "script",
        "name": str(SCRIPTS / "run_ddp.py"),
        "args": [str(oracle_dir), "3"],
    }
    assert m["layout"] == {"dp": 2, "tp": 1, "pp": 1}
    assert m["versions"]["torch"] and m["hosts"] and m["end_ns"] > m["start_ns"]
    for r, rd in run.ranks.items():
        oracle = json.loads((oracle_dir / f"oracle_rank{r}.json").read_text())
        assert oracle["argv"] == [str(oracle_dir), "3"]  # the script saw its own arguments
        # Flight Recorder's collectives (the clock sync's send/recv are meshprof's own, paused)
        fr_ops = [o for o in oracle["ops"] if o not in ("send", "recv")]
        assert len(fr_ops) >= 3 + 1
        assert collections.Counter(op_names(rd.events)) == collections.Counter(fr_ops)
        assert rd.meta["total_events"] == len(fr_ops) and rd.meta["rank"] == r
        # steps: one closed step span per optimizer step, DDP's bucket all_reduces tagged 0..2
        steps = rd.spans[rd.spans["kind"] == SPAN_KINDS.index("step")]
        assert len(steps) == oracle["optimizer_steps"] == rd.meta["steps_detected"] == 3
        assert steps["step"].tolist() == [0, 1, 2]
        assert rd.meta["step_detection"] == "optimizer"  # --step-detect auto: it trains
        # events are stored in completion order; a bucket all_reduce polled to completion can
        # land after the final synchronous all_reduce, so compare in issue (start) order
        ar = rd.events[rd.events["op"] == OP_NAMES.index("all_reduce")]
        ar = ar[np.argsort(ar["start_ns"], kind="stable")]
        assert ar["step"].tolist() == [0, 1, 2, 3]
        assert (steps["start_ns"][1:] >= steps["start_ns"][:-1] + steps["duration_ns"][:-1]).all()
        assert rd.meta["exit"]["how"] == "normal" and rd.meta["exit"]["code"] == 0
        assert rd.meta["world_size"] == 2 and rd.meta["hostname"]
        assert rd.meta["groups"][0]["ranks"] == [0, 1]
        assert len(rd.memory) == 3
    # the non-reference rank took clock-sync samples (t_send <= t_recv on its own clock)
    samples = run.ranks[1].meta["clock_sync"]["samples"]
    assert len(samples) > 0 and all(s[0] <= s[2] for s in samples)
    assert result["stats"]["by_op"] and sum(r["count"] for r in result["stats"]["by_rank"]) == sum(
        len(rd.events) for rd in run.ranks.values()
    )


def _group_dims(report: dict) -> dict[str, str]:
    """Group name -> the dimension the report gives it."""
    return {g["name"]: g["dimension"] for g in report["collectives"]["groups"]}


def _advice(report: dict) -> list[str]:
    """Every suggestion the report makes: the verdict's, the rules' (run and per rank)."""
    out = [v["action"] for v in report["verdict"]]
    out += [b["suggestion"] for b in report["bottlenecks"]]
    for a in report["rank_analyses"]:
        out += [b["suggestion"] for b in a["bottlenecks"]]
    return out


@pytest.mark.timeout(180)
def test_run_inference_script_gets_a_step_per_request(tmp_path: Path, cli) -> None:
    """A tensor-parallel inference script (DTensor over gloo, no optimizer) under the default
    --step-detect auto: each request (one outermost forward) is a step, and the report's latency
    percentiles and request rate match the script's own timing of its requests.

    Its DeviceMesh names its one dimension "tp" and spans every rank, so DeviceMesh reuses the
    world group for it (as transformers' TP does): the report calls that group's collectives
    tp (DeviceMesh's own ``get_group()`` is the oracle), gives no gradient advice to a job with
    no backward and no optimizer, and counts CPU-hours (gloo on a machine without CUDA)."""
    out = tmp_path / "run"
    oracle_dir = tmp_path / "oracle"
    oracle_dir.mkdir()
    requests = 10
    p = cli.process(
        "run",
        "--nproc-per-node",
        "2",
        "-o",
        str(out),
        "--no-summary",
        str(SCRIPTS / "run_infer_tp.py"),
        str(oracle_dir),
        str(requests),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    run = load_run(out)
    assert sorted(run.ranks) == [0, 1] and run.problems == {}
    for rd in run.ranks.values():
        steps = rd.spans[rd.spans["kind"] == SPAN_KINDS.index("step")]
        assert len(steps) == requests == rd.meta["steps_detected"]
        assert steps["step"].tolist() == list(range(requests))
        assert rd.meta["step_detection"] == "forward"
        assert len(rd.events) >= requests  # the row-parallel all_reduce of every request
    rep = cli("report", str(out), "--json", "--all-causes")
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    rows = report["ranks"]
    assert [r["rank"] for r in rows] == [0, 1]
    # the layout from the job itself: the tp dimension is the world group, and it is tp
    for r in (0, 1):
        groups = json.loads((oracle_dir / f"oracle_rank{r}.json").read_text())["groups"]
        assert groups["tp"] == groups["world"] == {"name": "0", "ranks": [0, 1]}
        assert run.ranks[r].meta.groups[0].mesh_dims == ["tp"]
        assert run.ranks[r].meta.layout_assumed  # (no --layout: pure DP was assumed)
    assert _group_dims(report) == {"0": "tp"}
    causes = {v["cause"] for v in report["verdict"]}
    assert "exposed_comm_tp" in causes and "exposed_comm_dp" not in causes
    assert not [a for a in _advice(report) if "gradient" in a]
    tp = next(v for v in report["verdict"] if v["cause"] == "exposed_comm_tp")
    assert "forward-only" in tp["action"]
    assert {v["device"] for v in report["verdict"]} == {"CPU"}
    assert all(v["device_hours"] == v["gpu_hours"] > 0 for v in report["verdict"])
    text = cli("report", str(out), "--all-causes").stdout
    assert "CPU-h" in text and "GPU-h" not in text and "exposed data-parallel" not in text
    for row in rows:
        oracle = json.loads((oracle_dir / f"oracle_rank{row['rank']}.json").read_text())
        assert row["steps"] == oracle["requests"] == requests
        own = np.asarray(oracle["request_ns"], dtype=float)
        p50, p95, p99 = np.percentile(own, [50, 95, 99])
        # the step is the outermost forward; the script's clock also covers the call into it:
        # P50 within 10% + 0.5 ms, the tail (the first request's warm-up) within 15%
        assert abs(row["step_p50_ns"] - p50) <= 0.10 * p50 + 5e5, (row, p50)
        assert abs(row["step_p95_ns"] - p95) <= 0.15 * p95 + 5e5, (row, p95)
        assert abs(row["step_p99_ns"] - p99) <= 0.15 * p99 + 5e5, (row, p99)
        assert row["step_p50_ns"] <= row["step_p95_ns"] <= row["step_p99_ns"]
        rate = requests * 1e9 / oracle["elapsed_ns"]
        assert abs(row["steps_per_s"] - rate) <= 0.15 * rate, (row, rate)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_names_each_group_by_its_device_mesh_dimension(tmp_path: Path, cli) -> None:
    """4 ranks, a DeviceMesh of dp=2 x tp=2 with named dimensions (TP inside each replica, an
    all_reduce over dp per request, one over the world): every group is named for the dimension
    DeviceMesh says it serves (the script's ``mesh.get_group(dim)``), and the world group, which
    no mesh names, is not taken for data parallelism (the assumed pure-DP layout is refuted)."""
    out, oracle_dir = tmp_path / "run", tmp_path / "oracle"
    oracle_dir.mkdir()
    script = str(SCRIPTS / "run_infer_tp.py")
    p = cli.process(
        "run", "--nproc-per-node", "4", "-o", str(out), "--no-summary",
        script, str(oracle_dir), "4", "dp=2,tp=2", timeout=280,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    rep = cli("report", str(out), "--json")
    assert rep.returncode == 0, rep.stderr
    report = json.loads(rep.stdout)
    dims = _group_dims(report)
    run = load_run(out)
    for r in range(4):
        groups = json.loads((oracle_dir / f"oracle_rank{r}.json").read_text())["groups"]
        recorded = {g.name: g for g in run.ranks[r].meta.groups}
        for dim in ("dp", "tp"):
            name = groups[dim]["name"]
            assert dims[name] == dim, (r, dim, groups[dim], dims)
            assert list(recorded[name].ranks) == groups[dim]["ranks"]
            assert recorded[name].mesh_dims == [dim]
            assert len(groups[dim]["ranks"]) == 2  # a real subgroup, not the world
        assert dims[groups["world"]["name"]] == "other"  # neither dp nor tp: all of them
    assert not [a for a in _advice(report) if "gradient" in a]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("mesh", "layout", "dim"),
    [
        ("unnamed", None, "dp"),  # no names: today's inference (pure DP assumed)
        ("tp", "dp=2,tp=1,pp=1", "dp"),  # the user's --layout overrides the mesh's names
    ],
)
def test_run_without_mesh_names_or_with_layout(
    tmp_path: Path, cli, mesh: str, layout: str | None, dim: str
) -> None:
    """Where the job names nothing, the assumed layout still decides; where the user gives
    --layout, it wins over the job's DeviceMesh names (which are still recorded)."""
    out, oracle_dir = tmp_path / "run", tmp_path / "oracle"
    oracle_dir.mkdir()
    given = ("--layout", layout) if layout else ()
    p = cli.process(
        "run", "--nproc-per-node", "2", "-o", str(out), "--no-summary", *given,
        str(SCRIPTS / "run_infer_tp.py"), str(oracle_dir), "4", mesh, timeout=280,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    run = load_run(out)
    world = run.ranks[0].meta.groups[0]
    assert world.desc == "default_pg" and world.mesh_dims == (["tp"] if mesh == "tp" else None)
    assert run.ranks[0].meta.layout_assumed is (True if layout is None else None)
    report = json.loads(cli("report", str(out), "--json", "--all-causes").stdout)
    assert _group_dims(report) == {"0": dim}
    assert not [a for a in _advice(report) if "gradient" in a]  # still no backward


@pytest.mark.timeout(180)
def test_run_keeps_exit_code_and_writes_the_sigtermed_rank(tmp_path: Path, cli) -> None:
    out = tmp_path / "run"
    p = cli.process(
        "run", "--nproc-per-node", "2", "-o", str(out), "--no-summary", str(SCRIPTS / "run_fail.py")
    )
    assert p.returncode == 5, p.stderr[-3000:]  # rank 1's sys.exit(5), not torchrun's generic 1
    run = load_run(out)
    assert sorted(run.ranks) == [0, 1] and run.problems == {}
    r0, r1 = run.ranks[0], run.ranks[1]
    assert r1.meta["exit"]["how"] == "exit" and r1.meta["exit"]["code"] == 5
    # rank 0 was blocked when torchrun ended the job with SIGTERM: its file was written then
    assert r0.meta["exit"]["how"] == "signal" and r0.meta["exit"]["error"] == "SIGTERM"
    for rd in (r0, r1):
        assert op_names(rd.events) == ["all_reduce"] * 4
        assert (rd.events["in_bytes"] == 64).all() and (rd.events["duration_ns"] > 0).all()
    m = run.manifest
    assert m["exit_code"] == 5 and m["torchrun_exit_code"] != 0 and m["status"] == "failed"
    assert m["rank_exit_codes"]["1"] == 5


@pytest.mark.timeout(180)
def test_run_module_that_raises(tmp_path: Path, cli) -> None:
    out = tmp_path / "run"
    p = cli.process(
        "run", "--nproc-per-node", "2", "-o", str(out), "-m", "run_raise", "--x", "1", cwd=SCRIPTS
    )
    assert p.returncode == 1, p.stderr[-3000:]
    assert "ValueError: boom" in p.stderr  # the script's own traceback is printed as usual
    run = load_run(out)
    assert sorted(run.ranks) == [0, 1]
    assert run.manifest["target"] == {"kind": "module", "name": "run_raise", "args": ["--x", "1"]}
    for rd in run.ranks.values():
        ex = rd.meta["exit"]
        assert ex["how"] == "exception" and ex["code"] == 1
        assert "ValueError: boom argv=['--x', '1'] name=__main__" in ex["error"]
        assert op_names(rd.events) == ["all_reduce", "all_reduce"]
    assert "ranks" in p.stdout  # the summary was printed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "no training script given"),
        (("no_such_script.py",), "no_such_script.py: no such script file"),
        (("--nproc-per-node", "zero", "x.py"), "--nproc-per-node 'zero'"),
        (("--hang-timeout", "soon", "x.py"), "--hang-timeout 'soon': expected a number"),
        (("--hang-action", "explode", "x.py"), "--hang-action 'explode'"),
        (("-m",), "-m needs a module name"),
        (("--step-detect", "bogus", "x.py"), "--step-detect 'bogus': expected auto, optimizer"),
    ],
)
def test_run_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], message: str, cli, monkeypatch
) -> None:
    # in this process (the command's own code path: main's return code and stderr); one case
    # runs in a fresh interpreter below
    (tmp_path / "x.py").write_text("print('never runs')\n")
    monkeypatch.chdir(tmp_path)
    p = cli("run", "-o", str(tmp_path / "out"), *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr
    assert not (tmp_path / "out").exists()


def test_run_bad_input_in_a_fresh_interpreter_is_one_line_and_exit_2(tmp_path: Path, cli) -> None:
    """The same as a process: nothing else reaches stderr (an import's warning, a traceback)."""
    (tmp_path / "x.py").write_text("print('never runs')\n")
    args = ("--hang-timeout", "soon", "x.py")
    p = cli.process("run", "-o", str(tmp_path / "out"), *args, cwd=tmp_path, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--hang-timeout 'soon': expected a number" in lines[0], p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(180)
def test_run_hang_is_dumped_diagnosed_and_ended(tmp_path: Path, cli) -> None:
    out = tmp_path / "run"
    p = cli.process(
        "run",
        "--nproc-per-node",
        "2",
        "-o",
        str(out),
        "--hang-timeout",
        "2",
        "--no-summary",
        str(SCRIPTS / "run_hang.py"),
    )
    assert p.returncode == 3, p.stderr[-3000:]  # EXIT_HANG: the launcher ended the job
    assert sorted(f.name for f in (out / "hang").glob("rank*.json")) == ["rank0.json", "rank1.json"]
    run = load_run(out)
    assert run.manifest["status"] == "hang" and run.manifest["hang"]["killed"] is True
    # rank 0 was stuck in the all_reduce rank 1 never issued; both files were written at the end
    assert [OP_NAMES[c] for c in run.ranks[0].events["op"].tolist()] == ["all_reduce"]
    assert run.ranks[0].meta["exit"]["how"] == "signal"
    assert "all_reduce" in p.stdout and "1" in p.stdout  # the diagnosis names the op and the rank


@pytest.mark.timeout(240)
def test_run_two_nodes_share_one_run_dir(tmp_path: Path, cli) -> None:
    """Two launchers (`--nnodes 2 --node-rank 0/1`, static rendezvous on this host) write one
    run directory: one node record each, every rank's file, and a manifest merged from both
    (nodes, hosts, per-rank exit codes, status)."""
    from meshprof.launch.spawn import free_port

    out = tmp_path / "run"
    port = str(free_port())
    procs = [
        cli.start(
            "run",
            "--nnodes",
            "2",
            "--node-rank",
            str(k),
            "--nproc-per-node",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            "-o",
            str(out),
            "--no-summary",
            str(SCRIPTS / "run_nodes.py"),
            "-1",
            "0",
        )
        for k in (0, 1)
    ]
    outs = [p.communicate(timeout=200) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    run = load_run(out)
    assert sorted(run.ranks) == [0, 1] and run.problems == {}
    for r, rd in run.ranks.items():
        assert op_names(rd.events) == ["all_reduce"] * 3 + ["barrier"]
        assert rd.meta["node_rank"] == r and rd.meta["node_id"]
    assert run.ranks[0].meta["node_id"] != run.ranks[1].meta["node_id"]
    m = run.manifest
    nodes = m["nodes"]
    assert [n["node_rank"] for n in nodes] == [0, 1]
    assert [n["ranks"] for n in nodes] == [[0], [1]]
    assert [n["node_id"] for n in nodes] == [run.ranks[r].meta["node_id"] for r in (0, 1)]
    assert [(n["exit_code"], n["status"]) for n in nodes] == [(0, "ok"), (0, "ok")]
    assert m["rank_exit_codes"] == {"0": 0, "1": 0}
    assert m["exit_code"] == 0 and m["status"] == "ok" and m["world_size"] == 2
    assert m["end_ns"] == max(n["end_ns"] for n in nodes) > m["start_ns"]
    # the manifest on disk, written by the last launcher to finish, is the merged one
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk["status"] == "ok" and len(on_disk["nodes"]) == 2
    p = cli("report", str(out), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert sorted(r["rank"] for r in json.loads(p.stdout)["ranks"]) == [0, 1]
    p = cli("report", str(out))
    assert p.returncode == 0 and "job: ok, exit code 0, 2 nodes" in p.stdout, p.stdout[:2000]


def test_node_records_merge_without_a_shared_file_system(tmp_path: Path) -> None:
    """Per-node directories copied together: the manifest.json that survives is one node's
    (here the healthy node's), but the node records decide the job's status, exit code and
    per-rank codes; a node still running keeps end_ns open."""
    from meshprof.rundir.manifest import write_manifest, write_node_record

    run_dir = tmp_path / "run"
    base = {"node_rank": 0, "host": "a", "hosts": ["a"], "start_ns": 100, "end_ns": 900}
    write_node_record(
        run_dir,
        "a-1",
        {
            **base,
            "node_id": "a-1",
            "ranks": [0, 1],
            "rank_exit_codes": {"0": 0, "1": 0},
            "exit_code": 0,
            "torchrun_exit_code": 0,
            "status": "ok",
        },
    )
    write_node_record(
        run_dir,
        "b-7",
        {
            **base,
            "node_id": "b-7",
            "node_rank": 1,
            "host": "b",
            "hosts": ["b"],
            "ranks": [2, 3],
            "rank_exit_codes": {"2": 0, "3": 3},
            "exit_code": 3,
            "torchrun_exit_code": 1,
            "status": "failed",
            "start_ns": 50,
            "end_ns": 1000,
        },
    )
    write_manifest(
        run_dir,
        {
            "world_size": 4,
            "hosts": ["a"],
            "status": "ok",
            "exit_code": 0,
            "rank_exit_codes": {"0": 0, "1": 0},
            "start_ns": 100,
        },
    )
    from meshprof.rundir.manifest import merge_node_records, read_node_records

    recs = read_node_records(run_dir)
    assert [r["node_id"] for r in recs] == ["a-1", "b-7"]
    m = merge_node_records(json.loads((run_dir / "manifest.json").read_text()), recs)
    assert m["status"] == "failed" and m["exit_code"] == 3 and m["torchrun_exit_code"] == 1
    assert m["rank_exit_codes"] == {"0": 0, "1": 0, "2": 0, "3": 3}
    assert m["hosts"] == ["a", "b"] and m["start_ns"] == 50 and m["end_ns"] == 1000
    assert [n["ranks"] for n in m["nodes"]] == [[0, 1], [2, 3]]
    # node b still running (its launcher has not finished): the job is not over
    write_node_record(
        run_dir, "b-7", {**recs[1], "status": "running", "end_ns": None, "exit_code": None}
    )
    m = merge_node_records({}, read_node_records(run_dir))
    assert m["status"] == "running" and m["end_ns"] is None and m["exit_code"] == 0
    # a manifest written on one node of two says the other is missing; with both records
    # read it is not (node-local directories read together, or gathered)
    m = merge_node_records({"nnodes": "2", "nodes_missing": 1}, read_node_records(run_dir))
    assert m["nodes_missing"] is None
    m = merge_node_records({"nnodes": "3", "nodes_missing": 2}, read_node_records(run_dir))
    assert m["nodes_missing"] == 1
    # a damaged record is skipped, the others still merge
    (run_dir / "nodes" / "zz.json").write_text("{not json")
    assert len(read_node_records(run_dir)) == 2


@pytest.mark.timeout(240)
def test_run_sigkilled_rank_is_recovered_and_named_first(tmp_path: Path, cli) -> None:
    """Rank 1 of 3 SIGKILLs itself mid-step under the default flush interval (30 s: it never
    got a periodic write). Its data comes back from the crash-safe files up to its last tick,
    the manifest has torchrun's -9, and the report names it first."""
    out = tmp_path / "run"
    side = tmp_path / "side"
    side.mkdir()
    p = cli.process(
        "run",
        "--nproc-per-node",
        "3",
        "-o",
        str(out),
        str(SCRIPTS / "run_sigkill.py"),
        str(side),
        "2",
        timeout=200,
    )
    killed = json.loads((side / "killed.json").read_text())
    assert p.returncode == 128 + 9, p.stderr[-3000:]  # the first failure: death by SIGKILL
    run = load_run(out)
    assert sorted(run.ranks) == [0, 1, 2] and run.problems == {}
    assert not (out / "crashsafe").exists()  # the launcher turned them into rank01.npz
    m = run.manifest
    assert m["rank_exit_codes"]["1"] == -9 and m["rank_signals"]["1"] == "SIGKILL"
    assert m["status"] == "failed" and m["exit_code"] == 137
    r1 = run.ranks[1]
    assert r1.meta.recovered is not None and r1.meta.recovered["step"] == killed["step"]
    assert r1.meta.exit is not None and r1.meta.exit.how == "signal"
    ar = OP_NAMES.index("all_reduce")
    mine = r1.events[r1.events["op"] == ar]
    # every all_reduce that returned at least 1 s before the death was recovered (and none
    # that the script did not run)
    old = sum(1 for t in killed["done_ns"] if t <= killed["kill_ns"] - 1_000_000_000)
    assert old <= len(mine) <= len(killed["done_ns"]), (old, len(mine), len(killed["done_ns"]))
    assert old > 0
    # ... and they are the collectives the survivors recorded under the same (group, seq)
    assert mine["seq"].tolist() == list(range(len(mine)))
    for peer in (0, 2):
        ev = run.ranks[peer].events
        theirs = set(ev[ev["op"] == ar]["seq"].tolist())
        # (a survivor that torchrun killed before its last write is itself recovered up to its
        # own last tick, which may come before rank 1's: compare what both have)
        common = [q for q in mine["seq"].tolist() if q <= max(theirs)]
        assert set(common) <= theirs and len(common) >= old
        assert run.ranks[peer].meta.exit is not None
    rep = cli("report", str(out), "--json")
    assert rep.returncode == 0, rep.stderr
    failures = json.loads(rep.stdout)["failures"]
    assert failures[0] == {
        "rank": 1,
        "how": "signal",
        "exit_code": -9,
        "signal": "SIGKILL",
        "last_step": killed["step"],
        "last_seen_ns": failures[0]["last_seen_ns"],
        "first": True,
        "reason": "killed by SIGKILL",
        "recovered": True,
    }
    assert failures[0]["last_seen_ns"] >= killed["kill_ns"] - 1_000_000_000 - 200_000_000
    assert sorted(f["rank"] for f in failures[1:]) == [0, 2]
    assert not any(f["first"] for f in failures[1:])
    head = f"rank 1 was killed by SIGKILL at step {killed['step']}"
    assert head in cli("report", str(out)).stdout
    assert cli("report", str(out), "--html", str(tmp_path / "r.html")).returncode == 0
    page = (tmp_path / "r.html").read_text()
    assert page.index(head) < page.index("<h2>Summary</h2>")  # the HTML leads with it


@pytest.mark.timeout(240)
def test_the_launcher_needs_no_torch_and_a_failed_build_falls_back(tmp_path: Path) -> None:
    """The launcher never imports torch (its torchrun process makes the native recorder ready
    and says the versions): with an empty extension cache and a compiler that fails, the job
    still runs and exits 0, torchrun says once that it records with Python, the rank recorded
    with the Python kernel, and the manifest has torchrun's versions."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    launcher = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('LAUNCHER_TORCH', 'torch' in sys.modules, file=sys.stderr))\n"
        "sys.argv = ['meshprof', *sys.argv[1:]]\n"
        "runpy.run_module('meshprof.cli', run_name='__main__')\n"
    )
    args = ["run", "-o", str(out), "--no-summary", str(SCRIPTS / "run_nodes.py"), "-1", "0"]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "CXX": "/bin/false"}
    env.pop("MESHPROF_NATIVE", None)
    p = subprocess.run(
        [sys.executable, "-c", launcher, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "LAUNCHER_TORCH False" in p.stderr, p.stderr[-3000:]
    assert p.stderr.count("meshprof run: recording with the Python kernel") == 1, p.stderr
    assert "meshprof run: building the native recorder" in p.stderr
    run = load_run(out)
    assert sorted(run.ranks) == [0] and run.manifest["status"] == "ok"
    assert run.ranks[0].meta.recorder is not None
    assert run.ranks[0].meta.recorder.kernel == "python"
    assert op_names(run.ranks[0].events) == ["all_reduce"] * 3 + ["barrier"]
    versions = run.manifest["versions"]
    assert versions["torch"] and versions["recorder"]["kernel"] == "python", versions
