"""The per-rank step analyses on forked worker processes (``meshprof report --jobs``): the same
report as in-process, a dead worker's ranks analysed in-process, bad ``--jobs`` refused.

The comparisons run in a fresh interpreter: workers are forked only from a process with no
other Python thread, which a pytest process that ran other tests may not be."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from meshprof import forking
from meshprof.report import workers as rank_workers

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="workers are forked on Linux")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

SCRIPT = """
import json, os, sys
sys.path.insert(0, {bench!r})
from synth_run import write_run
from meshprof import forking
from meshprof.report import workers as rank_workers
from meshprof.report.analysis import analyze_run_parts
from meshprof.report.stages import rank_analyses as stage_mod
from meshprof.rundir import load_run

info = write_run(
    __import__("pathlib").Path({run!r}), 24, collectives=120, steps=4, slow_rank=7,
    seed=5, layout=(3, 2, 4), clock_ms=30,
)
parent = os.getpid()
used = []
real = rank_workers.analyze_in_workers

def spy(*args, **kwargs):
    got = real(*args, **kwargs)
    used.append(got)
    return got

import meshprof.report.executor as executor_mod
executor_mod.analyze_in_workers = spy

def dying(run, after_rank=None, only_ranks=None):
    # a worker holding rank 0 dies as one killed for memory would
    if os.getpid() != parent and 0 in only_ranks:
        os._exit(9)
    return stage_mod.analyze_ranks(run, after_rank, only_ranks)

mode = {mode!r}
if mode == "dying":
    object.__setattr__(stage_mod.by_rank, "compute", dying)
one = analyze_run_parts(load_run({run!r}, lean=True), workers=1).report.to_dict()
many = analyze_run_parts(load_run({run!r}, lean=True), workers=3, release_events=True)
w = used[-1]
print(json.dumps({{
    "same": one == many.report.to_dict(),
    "in_workers": w is not None,
    "failed_chunks": None if w is None else w.failed_chunks,
    "ranks": len(many.report[stage_mod.RANK_ANALYSES]),
    "named": [s for s in many.report.to_dict()["summary"]["stragglers"]],
    "slow": info["slow_rank"],
}}))
"""


def _run(tmp_path: Path, mode: str) -> dict:
    code = textwrap.dedent(SCRIPT).format(bench=str(BENCH), run=str(tmp_path / "run"), mode=mode)
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_workers_give_the_in_process_report(tmp_path):
    out = _run(tmp_path, "plain")
    assert out["in_workers"] and out["failed_chunks"] == 0
    assert out["ranks"] == 24
    assert out["same"]
    assert out["slow"] in out["named"]


def test_a_dead_worker_costs_no_rank(tmp_path):
    out = _run(tmp_path, "dying")
    assert out["in_workers"] and out["failed_chunks"] >= 1, out
    assert out["ranks"] == 24
    assert out["same"]


LOAD_SCRIPT = """
import json, os, sys
sys.path.insert(0, {bench!r})
from pathlib import Path
import numpy as np
from synth_run import write_run
from meshprof import forking
from meshprof.rundir import load_run

run_dir = Path({run!r})
write_run(run_dir, 24, collectives=120, steps=4, slow_rank=7, seed=5, layout=(3, 2, 4), fmt="npz")
damaged = run_dir / "rank00011.npz"
damaged.write_bytes(damaged.read_bytes()[:300])
started = []
real = forking.start
forking.start = lambda *a: started.append(real(*a)) or started[-1]
one = load_run(run_dir, lean=True)
many = load_run(run_dir, lean=True, processes=3)
same = sorted(one.ranks) == sorted(many.ranks) and one.problems == many.problems
for r, rd in one.ranks.items():
    other = many.ranks[r]
    for name in ("events", "spans", "memory"):
        a, b = getattr(rd, name), getattr(other, name)
        same = same and a.dtype == b.dtype and np.array_equal(a, b)
    same = same and rd.meta == other.meta and rd.span_names == other.span_names
world = [rd.meta.groups[0].ranks for rd in many.ranks.values()]
print(json.dumps({{
    "forked": started[-1] is not None,
    "same": bool(same),
    "ranks": len(many.ranks),
    "problems": sorted(many.problems),
    "world_shared": all(w is world[0] for w in world),
}}))
"""


def test_forked_loading_gives_the_serial_load(tmp_path):
    code = textwrap.dedent(LOAD_SCRIPT).format(bench=str(BENCH), run=str(tmp_path / "run"))
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["forked"] and out["same"]
    assert out["ranks"] == 23 and out["problems"] == [11]
    assert out["world_shared"]


BROKEN_WHILE_SUBMITTING = """
import json, os, time
from concurrent.futures import ProcessPoolExecutor
from meshprof import forking

real_submit = ProcessPoolExecutor.submit

def slow_submit(pool, *args):
    # the parent submits its parts slowly (a loaded host): the first part's worker is dead
    # before the second is submitted
    if getattr(pool, "_meshprof_submitted", 0):
        time.sleep(1.0)
    pool._meshprof_submitted = 1
    return real_submit(pool, *args)

ProcessPoolExecutor.submit = slow_submit
parent = os.getpid()

def work(part):
    if part == 0:
        os._exit(9)  # killed at once, as for memory
    return part * 10

forked = forking.start(work, [0, 1, 2, 3], 2)
print(json.dumps(None if forked is None else forked.results()))
"""


def test_a_worker_dead_before_all_parts_are_submitted_fails_its_parts():
    """A worker that dies while the parent is still submitting breaks the pool under the later
    submits: the parts come back failed (None, to redo in-process), not the whole start
    (which once returned None: the report then never counted the dead worker)."""
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BROKEN_WHILE_SUBMITTING)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got is not None and len(got) == 4 and got[0] is None
    assert all(g is None or g == 10 * i for i, g in enumerate(got))


def test_no_fork_beside_another_thread():
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not forking.can_fork()
    finally:
        stop.set()
        t.join()


def test_default_workers():
    assert rank_workers.default_workers(rank_workers.MIN_RANKS - 1) == 1
    assert 1 <= rank_workers.default_workers(4096) <= rank_workers.MAX_WORKERS
    for n, w in ((10, 2), (4096, 16), (3, 8)):
        chunks = forking.chunks(list(range(n)), w)
        assert [r for c in chunks for r in c] == list(range(n))
        assert all(chunks) and len(chunks) <= 4 * w


@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_bad_jobs_exit_2(tmp_path, cli, bad):
    p = cli("report", str(tmp_path), "--jobs", bad)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--jobs" in p.stderr


def test_cgroup_quota_caps_the_workers(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("250000 100000\n")  # 2.5 CPUs: 3 workers
    assert forking.cgroup_cpu_quota(str(v2)) == 3
    assert forking.usable_cores(str(v2)) <= 3
    (v2 / "cpu.max").write_text("max 100000\n")
    assert forking.cgroup_cpu_quota(str(v2)) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert forking.cgroup_cpu_quota(str(v1)) == 1 and forking.usable_cores(str(v1)) == 1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert forking.cgroup_cpu_quota(str(v1)) is None
    assert forking.cgroup_cpu_quota(str(tmp_path / "none")) is None


def test_cli_default_workers_give_the_jobs_1_report(tmp_path):
    """``meshprof report --json`` from 64 rank files on forks its loading and analysis workers by
    default (when the machine has 2+ cores); its output is byte for byte ``--jobs 1``'s."""
    sys.path.insert(0, str(BENCH))
    from synth_run import write_run

    run = tmp_path / "run"
    write_run(run, 64, collectives=60, steps=3, slow_rank=9, seed=2, layout=(4, 4, 4))
    code = "import sys; from meshprof.cli import main; sys.exit(main())"

    def report(*extra: str) -> bytes:
        p = subprocess.run(
            [sys.executable, "-c", code, "report", str(run), "--json", *extra],
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert p.returncode == 0, p.stderr.decode()[-2000:]
        return p.stdout

    assert report() == report("--jobs", "1") == report("--jobs", "3")
    assert 9 in json.loads(report("--jobs", "2"))["summary"]["stragglers"]
