"""Fuzzing every file meshprof reads (issue 39): each kind of file of a run directory damaged at
random by a seeded mutator (``tests/fuzz_mutate.py``), then read by the commands that read it.
Each must answer with exit code 0 or 2 (``hang``: 1 when it found a hang, as documented), an
exit 2 with one line that names the run or the file, no traceback, within a time and a memory
bound, writing nothing but its own output (the run directory and a folder outside it are
compared before and after).

The base run directories are written once per session by meshprof's own writers
(``tests/fuzz_runs.py``). A case runs in a forked child of this process (the commands in-process
there, as the ``cli`` fixture runs them): the child has an address-space limit
(:data:`MEMORY_BOUND` above what it started with) and an alarm per case (:data:`TIME_BOUND`).

``MESHPROF_FUZZ_CASES=N`` runs N cases in all (default :data:`DEFAULT_CASES`, about a minute on
two cores); ``MESHPROF_FUZZ_SEED`` changes the seed. A failure names its case:
``kind file mutation -> command``, rerun alone with ``MESHPROF_FUZZ_ONLY=<case number>``."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import resource
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fuzz_mutate import mutate
from fuzz_runs import KINDS, build_runs

DEFAULT_CASES = 280
CASES = int(os.environ.get("MESHPROF_FUZZ_CASES", DEFAULT_CASES))
SEED = int(os.environ.get("MESHPROF_FUZZ_SEED", "39"))
ONLY = os.environ.get("MESHPROF_FUZZ_ONLY")
TIME_BOUND = 60.0
"""Seconds one case may take (a case takes about 0.1 s; the machine may be loaded)."""
MEMORY_BOUND = 1 << 30
"""Bytes of address space a case may add to what the child started with (a report of the
undamaged runs needs a few tens of MB)."""

READERS: dict[str, tuple[str, ...]] = {
    "manifest": ("report", "diff", "query", "export", "collect", "top"),
    "node": ("report", "collect", "top", "query"),
    "meta": ("report", "diff", "query", "export", "collect"),
    "cursor": ("report", "collect", "query"),
    "steps": ("report", "query", "export", "diff"),
    "segment": ("report", "diff", "query", "export", "collect"),
    "npz": ("report", "diff", "query", "export", "collect"),
    "live": ("top", "top"),
    "alerts": ("top",),
    "request": ("agent",),
    "capture": ("report", "agent"),
    "kineto": ("report", "trace"),
    "stacks": ("stacks-reader",),
    "hang": ("hang", "report"),
}
"""The commands that read each kind of file (``agent``: the rank's capture agent looking at the
requests; ``trace``: ``report --trace``, which merges the Kineto traces; ``stacks-reader``: the
asker's reading of the answers)."""


class CaseTimeout(BaseException):
    """A case ran past :data:`TIME_BOUND` (a BaseException: nothing in the command catches it)."""


# -- the cases ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    runs = build_runs(tmp_path_factory.mktemp("fuzz-base"))
    # every command once here, so that each case's child inherits the imports (duckdb, pyarrow,
    # the report's stages) instead of paying them again
    out = tmp_path_factory.mktemp("fuzz-warm")
    for case in ({"command": c} for c in ("report", "query", "export", "top", "hang", "diff")):
        _command(case, runs["seg"], runs["npz"], out)
    return runs


def _files(base: dict[str, Path], kind: str) -> list[tuple[str, str]]:
    pattern = re.compile(dict(KINDS)[kind])
    out = []
    for name, run in sorted(base.items()):
        for p in sorted(run.rglob("*")):
            rel = p.relative_to(run).as_posix()
            if p.is_file() and pattern.fullmatch(rel):
                out.append((name, rel))
    return out


def _cases(kind: str, files: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """This kind's share of the cases: (number, run, file, seed, command)."""
    kinds = [k for k, _ in KINDS]
    per = max(1, round(CASES / len(kinds)))
    first = kinds.index(kind) * per
    readers = READERS[kind]
    out = []
    for j in range(per):
        n = first + j
        if ONLY is not None and str(n) != ONLY:
            continue
        rng = random.Random(SEED * 1_000_003 + n)
        run, rel = rng.choice(files)
        out.append({"n": n, "run": run, "file": rel, "seed": rng.getrandbits(32),
                    "command": readers[j % len(readers)]})  # fmt: skip
    return out


# -- one case, in the child -----------------------------------------------------------------------
def _cli(*args: Any) -> tuple[int, str, str]:
    """``meshprof ARGS`` in this process, as the ``cli`` fixture runs it."""
    from meshprof.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([os.fspath(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return int(code), out.getvalue(), err.getvalue()


def _agent(run: Path) -> tuple[int, str, str]:
    """The rank's capture agent looking at the requests, a few steps apart."""
    from meshprof.api import StepMonitor
    from meshprof.session.capture_agent import CaptureAgent

    class Host:
        monitor = StepMonitor(track_pipeline=False)

        def rank(self) -> int:
            return 0

    agent = CaptureAgent(run, Host(), poll_s=0.01)
    for _ in range(3):
        agent.look()
        with Host.monitor.step():
            pass
    agent.stop()
    return 0, "", ""


def _stacks_reader(run: Path) -> tuple[int, str, str]:
    from meshprof.rundir.stacks import read_rank_stacks

    got = read_rank_stacks(run, "s1")
    return 0, f"{sorted(got)}", ""


def _command(case: dict[str, Any], run: Path, other: Path, out: Path) -> tuple[int, str, str]:
    c = case["command"]
    if c == "report":
        return _cli("report", run, "--json")
    if c == "trace":
        return _cli("report", run, "--json", "--trace", out / "t.json")
    if c == "diff":
        return _cli("diff", other, run, "--json")
    if c == "query":
        return _cli("query", run, "SELECT op, count(*) FROM events GROUP BY op")
    if c == "export":
        return _cli("export", run, out / "export")
    if c == "collect":
        return _cli("collect", run, "-o", out / "collected")
    if c == "top":
        return _cli("top", "--once", "--json", run)
    if c == "hang":
        return _cli("hang", run)
    if c == "agent":
        return _agent(run)
    if c == "stacks-reader":
        return _stacks_reader(run)
    raise AssertionError(c)


def _tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` and what it is (a file's hash, a link's target)."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha1(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def _check(case: dict[str, Any], code: int, out: str, err: str, run: Path) -> str:
    """What is wrong with the command's answer ("" when nothing)."""
    allowed = (0, 1, 2) if case["command"] == "hang" else (0, 2)
    if "Traceback" in err or "Traceback" in out:
        return f"a traceback: {err[-1500:]}"
    if code not in allowed:
        return f"exit code {code}: {err[-800:]}"
    if code == 2:
        lines = err.strip().splitlines()
        if len(lines) != 1:
            return f"{len(lines)} lines on stderr: {err[-800:]}"
        names = {run.name, Path(case["file"]).name, Path(case["file"]).parent.name}
        if not any(n and n in lines[0] for n in names):
            return f"the error names neither the run nor the file: {lines[0]}"
    return ""


def _run_case(
    case: dict[str, Any], base: dict[str, Path], work: Path, outside: Path
) -> dict[str, Any]:
    d = work / f"case{case['n']}"
    run = d / "run"
    shutil.copytree(base[case["run"]], run, symlinks=True)
    out = d / "out"
    out.mkdir()
    what = mutate(run / case["file"], random.Random(case["seed"]), outside)
    before_run, before_out = _tree(run), _tree(outside)
    t0 = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, TIME_BOUND)
    try:
        code, sout, serr = _command(case, run, base["seg" if case["run"] == "npz" else "npz"], out)
        problem = _check(case, code, sout, serr, run)
    except CaseTimeout:
        problem = f"ran past {TIME_BOUND:g} s"
    except MemoryError:
        problem = f"MemoryError (over {MEMORY_BOUND >> 20} MiB more)"
    except Exception as e:  # (the agent and the readers are called directly)
        problem = f"raised {type(e).__name__}: {e}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    took = time.monotonic() - t0
    if not problem and _tree(outside) != before_out:
        problem = "wrote outside the run directory"
    if not problem and case["command"] not in ("agent",) and _tree(run) != before_run:
        changed = sorted(set(_tree(run).items()) ^ set(before_run.items()))[:3]
        problem = f"changed the run directory it read: {changed}"
    shutil.rmtree(d, ignore_errors=True)
    return {**case, "what": what, "problem": problem, "s": round(took, 3)}


def _child(
    cases: list[dict[str, Any]], base: dict[str, Path], work: Path, outside: Path, fd: int
) -> None:
    def on_alarm(signum: int, frame: Any) -> None:
        raise CaseTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    cwd = work / "cwd" / "a" / "b"  # ("../../escaped" in a file, taken as a path, lands in sight)
    cwd.mkdir(parents=True)
    os.chdir(cwd)
    with contextlib.suppress(OSError, ValueError):
        used = _address_space()
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = used + MEMORY_BOUND
        if hard == resource.RLIM_INFINITY or limit < hard:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    with os.fdopen(fd, "w") as pipe:
        for case in cases:
            pipe.write(json.dumps({"start": case["n"]}) + "\n")
            pipe.flush()
            pipe.write(json.dumps(_run_case(case, base, work, outside)) + "\n")
            pipe.flush()


def _address_space() -> int:
    """This process' virtual memory size (bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmSize")


def _in_child(body: Callable[[int], None], timeout: float) -> Iterator[dict[str, Any]]:
    """Run ``body(write_fd)`` in a forked child; yield the JSON lines it writes; a child that
    dies or outlives ``timeout`` ends the lines with {"died": ...}."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.close(r)
            body(w)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    end = time.monotonic() + timeout
    buf = b""
    with os.fdopen(r, "rb") as pipe:
        os.set_blocking(pipe.fileno(), False)
        while time.monotonic() < end:
            chunk = pipe.read()
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield json.loads(line)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rest = pipe.read() or b""
                for line in (buf + rest).split(b"\n"):
                    if line.strip():
                        yield json.loads(line)
                if status != 0:
                    yield {"died": f"the child ended with status {status:#x}"}
                return
            time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    yield {"died": f"the cases ran past {timeout:.0f} s"}


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("kind", [k for k, _ in KINDS])
def test_damaged_files_get_a_clear_answer(base: dict[str, Path], tmp_path: Path, kind: str) -> None:
    files = _files(base, kind)
    assert files, f"the base runs hold no {kind} file"
    cases = _cases(kind, files)
    if not cases:
        pytest.skip("MESHPROF_FUZZ_ONLY names another kind's case")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "sentinel.json").write_text('{"world_size": 4}')
    work = tmp_path / "work"
    work.mkdir()
    escaped_before = Path("/tmp/escaped").exists()
    results, started = [], None
    timeout = TIME_BOUND * 2 + 30 * len(cases)
    for line in _in_child(lambda fd: _child(cases, base, work, outside, fd), timeout):
        if "start" in line:
            started = line["start"]
        elif "died" in line:
            results.append({"n": started, "problem": line["died"], "what": "?", "file": "?",
                            "command": "?", "s": 0})  # fmt: skip
        else:
            results.append(line)
    bad = [r for r in results if r["problem"]]
    assert bad or {r["n"] for r in results} == {c["n"] for c in cases}
    assert not bad, "\n".join(
        f"case {r['n']}: {kind} {r['file']} ({r['what']}) -> {r['command']}: {r['problem']}"
        for r in bad
    )
    assert sorted(os.listdir(tmp_path)) == ["outside", "work"]  # nothing beside the cases
    assert _tree(work) == {"cwd": "dir", "cwd/a": "dir", "cwd/a/b": "dir"}
    assert escaped_before or not Path("/tmp/escaped").exists()
