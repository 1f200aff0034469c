"""`meshprof run` end to end: the real CLI in a subprocess, real torchrun, 2 gloo workers."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meshprof.events import OP_NAMES, SPAN_KINDS
from meshprof.rundir import load_run

SCRIPTS = Path(__file__).parent / "scripts"


def meshprof_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "meshprof.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def op_names(events: np.ndarray) -> list[str]:
    return [OP_NAMES[c] for c in events["op"].tolist()]


@pytest.mark.timeout(180)
def test_run_ddp_script_records_every_collective_and_step(tmp_path: Path) -> None:
    out = tmp_path / "run"
    oracle_dir = tmp_path / "oracle"
    oracle_dir.mkdir()
    p = meshprof_cli(
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


@pytest.mark.timeout(180)
def test_run_keeps_exit_code_and_writes_the_sigtermed_rank(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = meshprof_cli(
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
def test_run_module_that_raises(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = meshprof_cli(
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
    ],
)
def test_run_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    (tmp_path / "x.py").write_text("print('never runs')\n")
    p = meshprof_cli("run", "-o", str(tmp_path / "out"), *args, cwd=tmp_path, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(180)
def test_run_hang_is_dumped_diagnosed_and_ended(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = meshprof_cli(
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
