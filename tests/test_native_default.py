"""The native (C++) recorder by default: selection, the one-per-host build, the fallback when it
cannot be built, and the handover from the Python kernel in the middle of a run.

Oracles: the number of collectives each test issues, PyTorch's Flight Recorder (gloo fills it
with every collective it enqueues), the processes' own count of build attempts.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from meshprof.errors import MeshprofError
from meshprof.launch.spawn import run_ranks
from native_helpers import require_native


# -- selection ---------------------------------------------------------------------------------
def _default_worker(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof

    prof = meshprof.enable()
    t = torch.ones(8)
    for _ in range(5):
        dist.all_reduce(t)
    meta = prof.meta()
    return {
        "backend": prof.backend_name,
        "events": sum(1 for e in prof.events() if e.op == "all_reduce"),
        "recorder": meta["recorder"],
    }


def test_default_records_with_native_when_built(cli: Any) -> None:
    require_native()
    env = {"MESHPROF_NATIVE": ""}
    for r in run_ranks(_default_worker, 2, timeout=120, env=env):
        assert r["backend"] == "native"
        assert r["events"] == 5
        assert r["recorder"]["kernel"] == "native"
    out = json.loads(cli("version", "--json").stdout)
    assert out["recorder"]["kernel"] == "native"
    assert out["recorder"]["native_built"] is True
    built = json.loads(cli("build-native", "--json").stdout)
    assert built["built"] is True and Path(built["library"]).is_file()


def test_opt_out_records_with_python(cli: Any) -> None:
    for r in run_ranks(_default_worker, 2, timeout=120, env={"MESHPROF_NATIVE": "0"}):
        assert r["backend"] == "python"
        assert r["events"] == 5
        assert r["recorder"] == {"kernel": "python"}
    os.environ["MESHPROF_NATIVE"] = "0"
    try:
        out = json.loads(cli("version", "--json").stdout)
    finally:
        del os.environ["MESHPROF_NATIVE"]
    assert out["recorder"]["kernel"] == "python"
    assert "MESHPROF_NATIVE=0" in out["recorder"]["reason"]


def test_cuda_without_the_toolkit_keeps_the_python_recorder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With CUDA present the native kernel is the default only where its CUDA build (device
    timing) is possible: one predicate says so."""
    import torch

    from meshprof.comm import native_ext, selection

    cuda = torch.cuda.is_available()
    assert selection.native_supports_device() is (not cuda or native_ext.build_with_cuda())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(native_ext, "build_with_cuda", lambda: False)
    assert selection.native_supports_device() is False
    planned = selection.planned_recorder(native=None)
    assert planned["kernel"] == "python" and "CUDA toolkit" in planned["reason"]
    monkeypatch.setattr(native_ext, "build_with_cuda", lambda: True)
    assert selection.native_supports_device() is True


# -- a failed build ----------------------------------------------------------------------------
def _failed_build_worker(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.comm import native_ext as native_build

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prof = meshprof.enable()
        before = prof.backend_name
        t = torch.ones(8)
        n = 0
        bg = native_build._background
        while True:  # record while the build fails, until it has ended on both ranks
            done = torch.tensor([1.0 if bg is None or bg.done.is_set() else 0.0])
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
            n += 1
            if done.item() == 1.0:
                break
            time.sleep(0.01)
        for _ in range(20):  # and after it failed
            dist.all_reduce(t)
            n += 1
        time.sleep(0.2)
    ours = [str(w.message) for w in caught if "meshprof" in str(w.message)]
    return {
        "before": before,
        "after": prof.backend_name,
        "issued": n,
        "recorded": sum(1 for e in prof.events() if e.op == "all_reduce"),
        "warnings": ours,
        "handover": prof.recorder_info().get("handover", {}),
        "internal_errors": prof.internal_errors,
    }


def test_failed_build_warns_once_and_keeps_recording(tmp_path: Path) -> None:
    # an empty extension cache and a compiler that fails: the real build path, failing
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path), "CXX": "/bin/false", "MESHPROF_NATIVE": ""}
    res = run_ranks(_failed_build_worker, 2, timeout=240, env=env)
    for r in res:
        assert r["before"] == "python" and r["after"] == "python"
        assert r["recorded"] == r["issued"] >= 20
        assert len(r["warnings"]) == 1, r["warnings"]
        assert "could not be built" in r["warnings"][0]
        assert "could not be built" in r["handover"]["error"]
        assert r["internal_errors"] == 0


def test_meshprof_run_falls_back_when_the_build_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from meshprof.comm import native_ext as native_build
    from meshprof.commands.run import prepare_native

    def no_compiler() -> None:
        raise FileNotFoundError("c++: not found")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("MESHPROF_NATIVE", raising=False)
    monkeypatch.setattr(native_build, "_compile", no_compiler)
    monkeypatch.setattr(native_build, "_module", None)  # as in a process that did not load it
    prepare_native(force=False)
    err = capsys.readouterr().err
    assert "building the native recorder" in err
    assert "c++: not found" in err
    assert os.environ["MESHPROF_NATIVE"] == "0"  # the workers record with Python, no retry
    with pytest.raises(MeshprofError, match="c\\+\\+: not found"):
        prepare_native(force=True)  # --native: an error


# -- one build per host ------------------------------------------------------------------------
def _counting_compile(count_file: Path, fail: bool) -> None:
    from meshprof.comm import native_ext as native_build

    with open(count_file, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(1.0)  # long enough for the others to queue on the lock
    if fail:
        raise RuntimeError("compiler exploded")
    native_build.library_path().parent.mkdir(parents=True, exist_ok=True)
    native_build.library_path().write_bytes(b"")


def _build_proc(tmp: str, barrier: Any, out: Any) -> None:
    """Two rounds, each started by all processes together: a build that fails, then one that
    succeeds, each in an empty cache. Reports (round, result, entered, returned) times."""
    from meshprof.comm import native_ext as native_build

    for name, fail in (("failing", True), ("working", False)):
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(tmp, name)
        native_build.extension_name()  # torch imported before the start
        count = Path(tmp, f"{name}.builds")
        barrier.wait(60)
        entered = time.time()
        try:
            native_build.ensure_built(lambda c=count, f=fail: _counting_compile(c, f))
            result = "ok"
        except MeshprofError as e:
            result = f"error: {e}"
        out.put((name, result, entered, time.time()))


def test_processes_starting_together_build_once(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_build_proc, args=(str(tmp_path), barrier, out)) for _ in range(3)]
    for p in procs:
        p.start()
    rows = [out.get(timeout=180) for _ in range(6)]
    for p in procs:
        p.join(30)
    for name in ("failing", "working"):
        mine = [r for r in rows if r[0] == name]
        assert len(mine) == 3
        # all three were waiting while the one build ran (the lock, not luck, kept it to one)
        assert max(r[2] for r in mine) < min(r[3] for r in mine)
        builds = (tmp_path / f"{name}.builds").read_text().split()
        assert len(builds) == 1, builds
        results = [r[1] for r in mine]
        if name == "working":
            assert results == ["ok"] * 3
        else:  # those who waited for the failed attempt do not retry it
            assert all("compiler exploded" in r for r in results), results


def test_cache_name_encodes_the_torch_build() -> None:
    import torch

    from meshprof.comm import native_ext as native_build

    name = native_build.extension_name()
    assert name.isidentifier()
    assert torch.__version__.split("+")[0].replace(".", "_") in name
    assert f"abi{int(torch._C._GLIBCXX_USE_CXX11_ABI)}" in name


# -- the handover in the middle of a run -------------------------------------------------------
def _fr_all_reduces() -> int:
    import torch

    entries = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, True))["entries"]
    return sum(1 for e in entries if e["profiling_name"] == "gloo:all_reduce")


def _handover_worker(
    rank: int, ws: int, iters: int, open_at_by_rank: tuple[int, ...]
) -> dict[str, Any]:
    import threading

    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.comm import native_ext as native_build

    open_at = open_at_by_rank[rank]
    gate = threading.Event()
    real_ensure_built = native_build.ensure_built

    def gated_ensure_built(*a: Any, **k: Any) -> Any:
        gate.wait()  # "the build" ends when the test says so
        return real_ensure_built(*a, **k)

    native_build.ensure_built = gated_ensure_built  # type: ignore[assignment]
    real_cached = native_build.cached
    native_build.cached = lambda: False  # type: ignore[assignment]
    prof = meshprof.enable()
    native_build.cached = real_cached  # type: ignore[assignment]
    first = prof.backend_name
    t = torch.ones(16)
    peer = 1 - rank
    issued = {"all_reduce": 0, "send": 0, "recv": 0, "broadcast_object_list": 0}
    switched_at = -1
    for i in range(iters):
        if i == open_at:
            gate.set()
            native_build._background.done.wait(60)  # type: ignore[union-attr]
        dist.all_reduce(t)
        issued["all_reduce"] += 1
        if i % 3 == 0:
            dist.all_reduce(t, async_op=True).wait()
            issued["all_reduce"] += 1
        if i % 5 == 0:
            for sender in (0, 1):
                if rank == sender:
                    dist.send(t, peer)
                    issued["send"] += 1
                else:
                    dist.recv(t, peer)
                    issued["recv"] += 1
        if i % 7 == 0:
            obj = [{"i": i}] if rank == 0 else [None]
            dist.broadcast_object_list(obj, src=0)
            issued["broadcast_object_list"] += 1
        if switched_at < 0 and prof.backend_name == "native":
            switched_at = i
    prof.settle(1.0)
    events = prof.events()
    return {
        "first": first,
        "last": prof.backend_name,
        "switched_at": switched_at,
        "issued": issued,
        "recorded": {op: sum(1 for e in events if e.op == op) for op in issued},
        "fr_all_reduce": _fr_all_reduces(),
        "keys": sorted((e.op, e.seq, e.peer) for e in events),
        "group_seqs": sorted(e.seq for e in events if e.peer < 0),
        "internal_errors": prof.internal_errors,
        "handover": prof.recorder_info().get("handover", {}),
    }


def test_handover_mid_run_loses_nothing_and_counts_nothing_twice() -> None:
    require_native()
    iters = 60
    env = {"TORCH_FR_BUFFER_SIZE": "20000", "MESHPROF_NATIVE": ""}
    # rank 0's build ends at iteration 10, rank 1's at 35: their numbers must stay aligned
    res = run_ranks(_handover_worker, 2, (iters, (10, 35)), timeout=240, env=env)
    for r in res:
        assert r["first"] == "python" and r["last"] == "native"
        assert r["handover"]["to"] == "native"
        assert r["recorded"] == r["issued"]
        assert r["recorded"]["all_reduce"] == r["fr_all_reduce"]
        # the group's numbers: every collective once, none missing, none twice
        assert r["group_seqs"] == list(range(len(r["group_seqs"])))
        assert r["internal_errors"] == 0
    a, b = res
    assert 10 <= a["switched_at"] < 35 <= b["switched_at"] < iters
    # both ranks agree on every (op, seq) although they switched at different iterations
    assert [k[:2] for k in a["keys"]] == [k[:2] for k in b["keys"]]


# -- quiet: torch's and the compiler's messages stay out of the training's output ---------------
def _python(code: str, **env: str) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def test_cpu_node_with_a_cuda_toolkit_is_quiet(tmp_path: Path) -> None:
    """torch logs "No CUDA runtime is found" when its extension tools are imported on a node with
    a CUDA toolkit and no GPU; every rank would print it. meshprof keeps it for doctor."""
    cuda_home = tmp_path / "cuda"
    cuda_home.mkdir()
    env = {"CUDA_HOME": str(cuda_home), "CUDA_VISIBLE_DEVICES": ""}
    # A CPU wheel never looks for CUDA_HOME: pose as a CUDA build (as on a GPU cluster's CPU node).
    cuda_build = (
        "import torch; torch.cuda._is_compiled = lambda: True; torch.version.cuda = '12.8'; "
        "torch.cuda.is_available = lambda: False\n"
    )
    plain = _python(cuda_build + "import torch.utils.cpp_extension", **env)
    if "No CUDA runtime" not in plain.stderr:
        pytest.skip("this torch does not log 'No CUDA runtime is found'")
    p = _python(
        cuda_build
        + "import os; os.environ.pop('TORCH_EXTENSIONS_DIR', None)\n"
        + "from meshprof.comm import native_ext as n; n._cpp_extension(); print(n.IMPORT_MESSAGES)",
        **env,
    )
    assert p.returncode == 0, p.stderr
    assert "No CUDA runtime" not in p.stderr
    assert "No CUDA runtime" in p.stdout


def test_finding_the_built_recorder_does_not_import_torchs_extension_tools() -> None:
    """A rank only asks whether the recorder is built (and where): that answer is torch's
    ``get_default_build_root()``, without the ~60 ms import of ``torch.utils.cpp_extension``."""
    p = _python(
        "import os, sys; os.environ.pop('TORCH_EXTENSIONS_DIR', None)\n"
        "from meshprof.comm import native_ext as n\n"
        "n.cached(); n.library_path()\n"
        "print('IMPORTED', 'torch.utils.cpp_extension' in sys.modules)\n"
        "print('OURS', n.build_root())\n"
        "from torch.utils.cpp_extension import get_default_build_root\n"
        "print('TORCH', get_default_build_root())\n"
    )
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines() if " " in line)
    assert lines["IMPORTED"] == "False"
    assert lines["OURS"] == lines["TORCH"]


def test_a_failing_build_writes_its_log_not_the_terminal(tmp_path: Path) -> None:
    """The compiler runs in a child whose output goes to build.log; the error names the log and
    doctor reports the failure."""
    ext = tmp_path / "ext"
    p = _python(
        "from meshprof.comm import native_ext as n\n"
        "from meshprof.errors import MeshprofError\n"
        "try:\n    n.ensure_built()\nexcept MeshprofError as e:\n    print('ERR', e)\n"
        "print('DIR', n.build_dir())\n"
        "print('FAILURE', n.last_failure())\n",
        TORCH_EXTENSIONS_DIR=str(ext),
        CXX=str(tmp_path / "no-such-compiler"),
        MESHPROF_NATIVE_VERBOSE="",
    )
    assert p.returncode == 0, p.stderr
    lines = dict(ln.split(" ", 1) for ln in p.stdout.splitlines() if " " in ln)
    assert "build.log" in lines["ERR"], p.stdout
    log = Path(lines["DIR"]) / "build.log"
    assert log.is_file() and log.stat().st_size > 0
    assert "no-such-compiler" in log.read_text(errors="replace")
    assert "no-such-compiler" not in p.stderr  # nothing of the build on the terminal
    assert lines["FAILURE"] != "None"
