"""`meshprof run` against what operators meet: a full disk, a read-only or reused run
directory, nodes without a shared file system, a launcher killed by SIGKILL. The real CLI in
subprocesses, real torchrun, gloo workers (1–2 per node)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshprof.rundir import load_run

SCRIPTS = Path(__file__).parent / "scripts"


@contextlib.contextmanager
def tmpfs(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (skips the test where mounting is not allowed:
    not root, or a container without the capability)."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    got = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True
    )
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()[:200]}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _done_steps(out: Path) -> dict[int, int]:
    got = {}
    for p in out.glob("done_rank*.json"):
        d = json.loads(p.read_text())
        got[d["rank"]] = d["steps"]
    return got


@pytest.mark.timeout(240)
def test_a_full_disk_never_harms_training(tmp_path: Path, cli) -> None:
    """A 2-rank DDP job on a 384 KiB tmpfs: the disk fills up mid-run (the job writes about
    0.5 KiB a step, so about step 750 of 1,200), the job finishes every step with exit code 0
    (as plain torchrun does), each rank says once that it stopped writing, and the report says
    what was not written."""
    out = tmp_path / "out"
    out.mkdir()
    steps = 1200
    with tmpfs(tmp_path / "tiny", "384k") as tiny:
        p = cli.process(
            "run",
            "--nproc-per-node",
            "2",
            "-o",
            str(tiny / "run"),
            "--no-summary",
            str(SCRIPTS / "run_steps.py"),
            str(steps),
            str(out),
            timeout=220,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        assert _done_steps(out) == {0: steps, 1: steps}
        assert "Traceback" not in p.stderr and "SIGBUS" not in p.stderr, p.stderr[-3000:]
        for r in (0, 1):
            assert p.stderr.count(f"meshprof: rank {r} stopped writing") == 1, p.stderr[-3000:]
        assert "ENOSPC" in p.stderr
        run = load_run(tiny / "run")
        assert run.manifest["status"] == "ok" and run.manifest["exit_code"] == 0
        for r, rd in run.ranks.items():
            st = rd.meta.storage
            assert st is not None and st.stopped == "ENOSPC", r
            assert rd.meta.exit is not None and rd.meta.exit.how == "normal"
            assert 0 < rd.file_events < int(rd.meta.total_events or 0)
        rep = cli("report", str(tiny / "run"), "--json")
        assert rep.returncode == 0, rep.stderr
        found = [f for f in json.loads(rep.stdout)["summary"]["findings"] if f["kind"] == "storage"]
        assert sorted(f["ranks"][0] for f in found) == [0, 1]
        assert all("writing stopped" in f["title"] and "ENOSPC" in f["title"] for f in found)


def _one_line_exit_2(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.timeout(120)
def test_an_unwritable_output_is_one_line_and_exit_2(tmp_path: Path, cli) -> None:
    # (the first two in this process, the command's own code path; the last in a fresh one)
    (tmp_path / "x.py").write_text("raise SystemExit('never runs')\n")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = cli("run", "-o", str(blocker / "run"), str(tmp_path / "x.py"))
    _one_line_exit_2(p, "cannot write the run directory", "Not a directory")
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        p = cli("run", "-o", str(ro / "run"), str(tmp_path / "x.py"))
        _one_line_exit_2(p, "cannot write the run directory", "Read-only file system")
    with tmpfs(tmp_path / "full", "64k") as full:
        (full / "filler").write_bytes(b"\0" * (64 << 10))  # already full
        p = cli.process("run", "-o", str(full / "run"), str(tmp_path / "x.py"), timeout=60)
        _one_line_exit_2(p, "cannot write the run directory", "No space left on device")


JOB7 = ("run", "--rdzv-id", "job7", "--no-summary", str(SCRIPTS / "run_nodes.py"), "-1", "0")
"""A 1-rank job that ends with 0, named by its rendezvous id (``meshprof-runs/job7``)."""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, cli_processes) -> Path:
    """The working directory of one finished run of :data:`JOB7` (its run directory:
    ``meshprof-runs/job7``), shared by the tests that need a directory holding another run;
    a test that writes beside it works on a copy."""
    cwd = tmp_path_factory.mktemp("finished")
    one = cli_processes.process(*JOB7, cwd=cwd)
    assert one.returncode == 0, one.stderr[-2000:]
    return cwd


@pytest.mark.timeout(200)
def test_runs_never_mix_in_one_directory(tmp_path: Path, cli, finished_run: Path) -> None:
    """A second run into the directory of a first: refused with -o; without -o (the same
    rendezvous id, so the same default name) a fresh subdirectory named by the run id, said."""
    shutil.copytree(finished_run / "meshprof-runs", tmp_path / "meshprof-runs")
    base = tmp_path / "meshprof-runs" / "job7"
    again = cli("run", "-o", str(base), *JOB7[3:])
    run_id = load_run(base).manifest.run_id
    _one_line_exit_2(again, str(base), f"holds run {run_id}, ok", "give another -o")
    two = cli.process(*JOB7, cwd=tmp_path)
    assert two.returncode == 0, two.stderr[-2000:]
    first_id = load_run(base).manifest.run_id
    (sub,) = [p for p in base.iterdir() if p.is_dir() and p.name.startswith("20")]
    assert f"{base} holds run {first_id}, ok: writing to {sub}" in two.stderr
    assert load_run(sub).manifest.run_id == sub.name != first_id
    assert sorted(load_run(base).ranks) == [0] and sorted(load_run(sub).ranks) == [0]


def _two_nodes(cli, tmp_path: Path, script: str, *args: str, outs=(None, None), cwd=None):
    from meshprof.launch.spawn import free_port

    port = str(free_port())
    procs = []
    for k in (0, 1):
        out = ["-o", str(outs[k])] if outs[k] is not None else []
        cmd = cli.command(
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
            *out,
            "--no-summary",
            str(SCRIPTS / script),
            *args,
        )
        procs.append(
            subprocess.Popen(
                cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs_ = [p.communicate(timeout=200) for p in procs]
    return [p.returncode for p in procs], [o[1] for o in outs_]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_node_local_directories_are_one_run(tmp_path: Path, cli, finished_run: Path) -> None:
    """Two launchers with one -o each (no shared file system): each directory holds its node's
    rank; alone, it does not call the other node's rank failed; together (report DIR1 DIR2, or
    gathered by collect) they are the whole job: every collective matched across the two, and
    the rank on node 1, who sleeps 250 ms a step, the one the other waited for most."""
    d0, d1 = tmp_path / "node0", tmp_path / "node1"
    # (not the straggler score: beside other jobs rank 0 once took 150-350 ms a step before its
    # last gradient bucket in half the steps, against rank 1's 250 ms sleep, and no rank was
    # named; a 50 ms sleep was once not even the most waited for)
    codes, errs = _two_nodes(cli, tmp_path, "ddp_straggler.py", "1", "0.25", "12", outs=(d0, d1))
    assert codes == [0, 0], [e[-2000:] for e in errs]
    run0, run1 = load_run(d0), load_run(d1)  # each node's directory alone
    assert sorted(run0.ranks) == [0] and sorted(run1.ranks) == [1]
    assert run0.manifest.run_id == run1.manifest.run_id  # agreed
    alone = json.loads(cli("report", str(d0), "--json").stdout)
    assert alone["failures"] == [] and "on another node" in alone["problems"][0]["reason"]
    assert alone["summary"]["metadata"]["nodes_missing"] == 1
    text = cli("report", str(d0)).stdout
    assert "job: ok, exit code 0; 1 of 2 nodes not read" in text
    # rank 0's waiting for the unread rank 1 stays in its exposed communication: it says so
    exposed = [v for v in alone["verdict"] if v["cause"].startswith("exposed_comm")]
    assert exposed and all("rank 1 ran on other nodes" in v["evidence"] for v in exposed)
    assert all(v["action"].startswith("read every node's directory") for v in exposed)
    both = json.loads(cli("report", str(d0), str(d1), "--json").stdout)
    assert both["summary"]["loaded_ranks"] == [0, 1] and both["problems"] == []
    # read together, no node is missing (node 0's manifest, written alone, said one was)
    assert both["summary"]["metadata"].get("nodes_missing") is None
    assert "not read" not in cli("report", str(d0), str(d1)).stdout
    assert not any("not read" in v["evidence"] for v in both["verdict"])
    issued = len(run0.ranks[0].events)  # what rank 0 recorded, read from its node alone
    assert issued == len(run1.ranks[1].events) > 12
    # every collective of the whole run (the report analyses the latest regime when a change
    # began mid-run: beside other jobs it once began at step 6)
    whole = json.loads(cli("report", str(d0), str(d1), "--json", "--steps", "all").stdout)
    assert whole["collectives"]["complete"] == issued and whole["collectives"]["incomplete"] == 0
    assert both["wait_causes"][0]["rank"] == 1
    assert [n["node_rank"] for n in both["summary"]["metadata"]["nodes"]] == [0, 1]
    merged = tmp_path / "merged"
    got = cli("collect", "-o", str(merged), str(d0), str(d1))
    assert got.returncode == 0, got.stderr
    again = cli("collect", "-o", str(merged), str(d0), str(d1), "--json")
    assert json.loads(again.stdout)["files"] == 0  # up to date: nothing copied again
    gathered = json.loads(cli("report", str(merged), "--json").stdout)
    assert gathered["summary"]["loaded_ranks"] == [0, 1]
    assert gathered["summary"]["metadata"].get("nodes_missing") is None
    assert gathered["collectives"] == both["collectives"] and gathered["failures"] == []
    assert gathered["wait_causes"] == both["wait_causes"]
    # a tar stream of one node's directory, unpacked beside the other's
    tarred = tmp_path / "tarred"
    with (
        cli_bytes(cli, "collect", "--tar", str(d1)) as stream,
        tarfile.open(fileobj=stream, mode="r|") as tar,
    ):
        tar.extractall(tarred, filter="data")
    assert sorted(load_run([d0, tarred]).ranks) == [0, 1]
    # another run's directory is never mixed in
    other = finished_run / "meshprof-runs" / "job7"
    mixed = cli("report", str(d0), str(other))
    assert mixed.returncode == 2 and "holds another run" in mixed.stderr


@contextlib.contextmanager
def cli_bytes(cli, *args: str) -> Iterator[object]:
    proc = subprocess.Popen(cli.command(*args), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        yield proc.stdout
    finally:
        proc.stdout.close()
        assert proc.wait(timeout=60) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_launchers_agree_on_one_directory_and_the_root_cause(tmp_path: Path, cli) -> None:
    """Two launchers in one working directory without -o (a shared file system): one
    directory, named by the run id they agreed on; rank 1 on node 1 is SIGKILLed, and the
    job's exit code is its (137), not node 0's (whose rank saw the connection close)."""
    side = tmp_path / "side"
    side.mkdir()
    codes, errs = _two_nodes(cli, tmp_path, "run_sigkill_nodes.py", str(side), cwd=tmp_path)
    assert codes[1] == 137, [e[-2000:] for e in errs]
    (run_dir,) = (tmp_path / "meshprof-runs").iterdir()
    run = load_run(run_dir)
    assert run.manifest.run_id == run_dir.name and sorted(run.ranks) == [0, 1]
    assert len(run.manifest.nodes or []) == 2
    assert run.manifest.exit_code == 137 and run.manifest.status == "failed"
    assert run.manifest.rank_signals == {"1": "SIGKILL"}


@pytest.mark.timeout(200)
def test_a_killed_launcher_ends_its_workers_and_reads_as_stale(tmp_path: Path, cli) -> None:
    import psutil

    out = tmp_path / "run"
    side, own_tmp = tmp_path / "side", tmp_path / "tmp"
    side.mkdir()
    own_tmp.mkdir()
    proc = subprocess.Popen(
        cli.command(
            "run", "--nproc-per-node", "2", "-o", str(out), str(SCRIPTS / "run_steps.py"),
            "100000", str(side), "5",
        ),
        # a temporary folder of its own: no other test's launcher removes its private folder
        env={**os.environ, "MESHPROF_HEARTBEAT_S": "0.5", "TMPDIR": str(own_tmp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if sum(len(rd.spans) > 2 for rd in load_run(out).ranks.values()) == 2:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the job did not start")
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 3  # torchrun and its 2 workers
        proc.kill()  # SIGKILL: no handler runs in the launcher
        proc.wait(timeout=10)
        _, alive = psutil.wait_procs(children, timeout=30)
        # a zombie has ended (its parent, killed, could not reap it; the machine's first process
        # reaps orphans only when it is an init)
        alive = [p for p in alive if _running(p)]
        assert alive == [], [_described(p) for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(2.5)  # four heartbeats (0.5 s) and the 2 s floor without one
    # the killed launcher could not remove its private folder; the next launcher's sweep does
    from meshprof.launch.private_dir import OWNER, PREFIX, sweep_stale

    left = [
        d
        for d in own_tmp.glob(f"{PREFIX}*")
        if (d / OWNER).is_file() and json.loads((d / OWNER).read_text())["pid"] == proc.pid
    ]
    assert len(left) == 1, left
    assert sweep_stale(own_tmp) == left and not left[0].exists()
    run = load_run(out)
    assert run.manifest.status == "stale"
    for rd in run.ranks.values():  # the workers wrote their final data on the way out
        assert rd.meta.exit is not None and rd.meta.exit.how == "signal"
    text = cli("report", str(out)).stdout
    assert "job: stale" in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_straggler_on_node_1_alerts_on_node_0(tmp_path: Path, cli) -> None:
    """Node-local directories: the launchers relay their ranks' live records through the
    rendezvous store, so node 0's alert rules see rank 1 (on node 1, whose files are only in
    node 1's directory) become a straggler, and `meshprof top` on either node shows both
    ranks."""
    from meshprof.launch.spawn import free_port
    from meshprof.rundir.live import read_alerts

    d0, d1, stop = tmp_path / "node0", tmp_path / "node1", tmp_path / "stop"
    port = str(free_port())
    procs = [
        subprocess.Popen(
            cli.command(
                "run", "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", port, "-o", str(d),
                "--live-interval", "0.5", "--alert-straggler-looks", "3", "--no-summary",
                str(SCRIPTS / "live_job.py"), "3000", "0.03", "0.06", "1", str(stop),
            ),
            env={**os.environ, "MESHPROF_RELAY_S": "0.5"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k, d in ((0, d0), (1, d1))
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        alert = None
        while alert is None and time.monotonic() < deadline:
            alert = next((a for a in read_alerts(d0) if a.kind == "straggler"), None)
            time.sleep(0.5)
        assert alert is not None and alert.ranks == (1,)
        assert not (d0 / "rank00001").exists()  # rank 1's data is on node 1's disk only
        for d in (d0, d1):
            top = json.loads(cli("top", str(d), "--json").stdout)
            assert [x["rank"] for x in top["ranks"]] == [0, 1], d
    finally:
        stop.write_text("")
        outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert "meshprof alert: rank 1 is a straggler" in outs[0][1]


def test_collect_takes_the_newest_copy_of_a_file_two_nodes_hold(tmp_path: Path) -> None:
    """A rank's live record is in its own node's directory and, relayed, in the others': the
    gathered copy is the one written last, and collecting again copies nothing (before, the
    two copies overwrote each other at every collect)."""
    from meshprof.rundir.gather import collect_into

    a, b, dest = tmp_path / "a", tmp_path / "b", tmp_path / "dest"
    for d, text, t in ((a, "relayed, older", 1_000), (b, "own, newer", 2_000)):
        f = d / "live" / "rank00001.json"
        f.parent.mkdir(parents=True)
        f.write_text(text)
        os.utime(f, ns=(t * 10**9, t * 10**9))
    first = collect_into(dest, [a, b])
    assert first.files == 2 and (dest / "live" / "rank00001.json").read_text() == "own, newer"
    assert collect_into(dest, [a, b]).files == 0
    assert collect_into(dest, [b, a]).files == 0
    assert (dest / "live" / "rank00001.json").read_text() == "own, newer"


def _described(p: object) -> str:
    """A process for a failure message: pid, state and the end of its command line (which of
    torchrun and the workers outlived the launcher, and in what state)."""
    import psutil

    assert isinstance(p, psutil.Process)
    try:
        return f"{p.pid} {p.status()} {' '.join(p.cmdline()[-4:])}"
    except psutil.Error as e:
        return f"{p.pid} ({type(e).__name__})"


def _running(p: object) -> bool:
    """Whether the process is still running (not ended, not a zombie)."""
    import psutil

    assert isinstance(p, psutil.Process)
    try:
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
