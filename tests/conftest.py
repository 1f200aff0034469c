"""Shared test fixtures: a clean recorder around every test, and ``cli``, the one way tests run
the ``meshprof`` command line; and how the suite runs in parallel (pytest-xdist, see
tests/README.md): the number of workers, one work unit per module (the serial tests one of their
own, first), the heaviest modules first, and the ``serial`` marker for tests that must have the
machine to themselves."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

CliArg = str | os.PathLike[str]


class MeshprofCli:
    """Runs the real ``meshprof`` command line and returns what it did as a
    :class:`subprocess.CompletedProcess` (``returncode``, ``stdout``, ``stderr`` as text).

    * ``cli(*args)``: in this process, through :func:`meshprof.cli.main` (fast; argparse's own
      exits become the return code, as they would be for a process);
    * ``cli.process(*args)``: ``python -m meshprof.cli`` in a fresh interpreter, where a test needs
      a real process (torchrun under it, signals, exit codes of a dying job, a clean import state);
    * ``cli.start(*args)``: the same process started and not waited for (several at once).
    """

    def __init__(self, capsys: pytest.CaptureFixture[str] | None) -> None:
        self._capsys = capsys

    def __call__(self, *args: CliArg) -> subprocess.CompletedProcess[str]:
        from meshprof.cli import main

        if self._capsys is None:
            raise RuntimeError("cli_processes runs commands as processes only: .process/.start")
        argv = [os.fspath(a) for a in args]
        self._capsys.readouterr()  # what the test printed before is not the command's output
        env = dict(os.environ)  # a command may set variables for its children (meshprof run)
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: usage errors (2), --help (0)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            if os.environ != env:  # ... which must not leak into the tests that follow
                os.environ.clear()
                os.environ.update(env)
        out = self._capsys.readouterr()
        return subprocess.CompletedProcess(["meshprof", *argv], code, out.out, out.err)

    @staticmethod
    def command(*args: CliArg) -> list[str]:
        """The argv of the real command line."""
        return [sys.executable, "-m", "meshprof.cli", *(os.fspath(a) for a in args)]

    def process(
        self,
        *args: CliArg,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args),
            cwd=cwd,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: CliArg) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> MeshprofCli:
    """The ``meshprof`` command line (see :class:`MeshprofCli`)."""
    return MeshprofCli(capsys)


@pytest.fixture(scope="session")
def cli_processes() -> MeshprofCli:
    """The command line for fixtures of a wider scope (a job that a module's tests share):
    ``.process``, ``.start`` and ``.command`` only."""
    return MeshprofCli(None)


@pytest.fixture(autouse=True)
def _reset_meshprof() -> Iterator[None]:
    import meshprof

    meshprof.reset()
    yield
    meshprof.reset()


# --- running the suite in parallel (pytest-xdist; pyproject's addopts: -n auto, loadgroup) -------

WORKERS_PER_CPU = 1.5
"""Workers per CPU core of a full run: the tests mostly wait on their subprocesses (ranks that
sleep, time out or wait for a peer), so a few more workers than cores keep the cores busy."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: PYTEST_XDIST_AUTO_NUM_WORKERS when set; 0 (every test in this process, as
    without xdist) when the command line names one file or test; else 1.5 per core, at least 2."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if env:
        return int(env)
    named = [a for a in config.args if a.endswith(".py") or "::" in a]
    if len(config.args) == 1 and named:
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, min(8, round((cpus or 1) * WORKERS_PER_CPU)))


def _weight(item: pytest.Item) -> int:
    """How long a test is expected to take, roughly: ``slow`` ones (over ~20 s) count 20."""
    return 20 if item.get_closest_marker("slow") is not None else 1


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, each module is one work unit (``xdist_group`` named after the module, unless
    the test names a group of its own), so a module-scoped fixture (a job shared by the module's
    tests) runs once; units are handed out heaviest first (sum of :func:`_weight`), so no long
    module starts last while the other workers sit idle."""
    if not getattr(config.option, "loadgroup", False):  # (set by xdist in its workers)
        return
    shared = _module_fixtures_of_parallel_tests(items)
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = item.nodeid.split("::", 1)[0]
            alone = _is_serial(item) and not (_module_fixtures(item) & shared.get(module, set()))
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP if alone else module))
        mark = item.get_closest_marker("xdist_group")
        assert mark is not None
        name = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
        groups.setdefault(name, []).append(item)
    order = sorted(
        groups.items(), key=lambda g: (g[0] != SERIAL_GROUP, -sum(_weight(i) for i in g[1]))
    )  # stable
    items[:] = [item for _, group in order for item in group]


SERIAL_GROUP = "serial"
"""The work unit of the serial tests: one worker runs them one after the other at the start
of the run, each handing the lock to the next, so the other workers wait for running tests to
end once instead of once per module that has a serial test. A serial test stays with its
module when it shares a module-scoped fixture (a job) with the module's parallel tests."""


def _module_fixtures(item: pytest.Item) -> set[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope in ("module", "package", "class")
    }


def _module_fixtures_of_parallel_tests(items: list[pytest.Item]) -> dict[str, set[str]]:
    """Per module: the module-scoped fixtures its tests that are not serial use."""
    out: dict[str, set[str]] = {}
    for item in items:
        if not _is_serial(item):
            out.setdefault(item.nodeid.split("::", 1)[0], set()).update(_module_fixtures(item))
    return out


def _lock_folder(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"meshprof-tests-{run}"


# --- bytecode caches -------------------------------------------------------------------------

sys.dont_write_bytecode = False
"""This process writes bytecode caches (``__pycache__``, ignored by git) even where
PYTHONDONTWRITEBYTECODE is set, as on this project's machines: pytest then keeps each test
module's rewritten code, which a worker would otherwise rewrite and compile again at every
collection (7 of a collection's 12 CPU seconds here)."""


def compile_sources() -> None:
    """Compile meshprof's modules and the tests' helpers to bytecode caches once, before the
    workers start. Every process the suite starts (a rank, torchrun, ``meshprof run``: hundreds)
    inherits PYTHONDONTWRITEBYTECODE and so could only read caches, never write them; without
    them each one compiles the ~270 modules it imports from source again (0.2 CPU s for the
    launcher alone). Up-to-date caches are left alone; nothing here can fail the run."""
    import compileall

    import meshprof

    for folder in (Path(meshprof.__file__).parent, Path(__file__).parent):
        with contextlib.suppress(Exception):
            compileall.compile_dir(folder, quiet=2)


SUITE_TMP = "MESHPROF_SUITE_TMPDIR"
"""Set by the controller to the temporary folder of this run's processes (see
:func:`own_tmpdir`)."""


def own_tmpdir() -> Path | None:
    """Give the run a temporary folder of its own, removed at its end: TMPDIR for every process
    the tests start. What torchrun (a ``torchelastic_*`` folder per job), a SIGKILLed launcher
    (its ``meshprof-launch-*`` folder) and other tools leave in the temporary folder then goes
    with the run, instead of piling up on a long-lived machine (~50 folders a run). pytest's own
    ``tmp_path`` folders stay where they were (the last three runs kept, for a look after a
    failure), and so does Inductor's compile cache (shared by the runs, as without this).
    None when the folder cannot be made (the run goes on in the usual one)."""
    import getpass

    base = tempfile.gettempdir()
    try:
        mine = Path(tempfile.mkdtemp(prefix="meshprof-suite-", dir=base))
    except OSError:
        return None
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", base)  # pytest's tmp_path: where it was
    with contextlib.suppress(Exception):
        user = "".join(c if c.isalnum() else "_" for c in getpass.getuser())
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(base) / f"torchinductor_{user}"))
    os.environ["TMPDIR"] = os.environ[SUITE_TMP] = str(mine)
    tempfile.tempdir = None  # this process too: gettempdir() is read again
    return mine


def _ranks_build_parallel_models() -> None:
    """Most ranks the tests fork build DDP, FSDP2, DTensor or pipelined models: the fork server
    of each worker imports those modules once (``spawn.PARALLEL_BY_DEFAULT``; ~1 CPU s a rank
    otherwise)."""
    from meshprof.launch import spawn

    spawn.PARALLEL_BY_DEFAULT = True


def pytest_configure(config: pytest.Config) -> None:
    """The controller (or the only process) compiles the bytecode caches
    (:func:`compile_sources`) and gives the run its own temporary folder (:func:`own_tmpdir`).
    The controller of a parallel run names the run (xdist hands the id to its workers), so
    that it can remove the run's lock files at the end."""
    controller = not hasattr(config, "workerinput")
    _ranks_build_parallel_models()
    if controller:
        compile_sources()
        if SUITE_TMP not in os.environ and (mine := own_tmpdir()) is not None:
            # removed at the exit of this process, after the cleanups registered later (atexit
            # runs them last first): multiprocessing's, whose folder (a fork server's) is in it
            atexit.register(shutil.rmtree, mine, ignore_errors=True)
    if (
        controller
        and getattr(config.option, "numprocesses", None)
        and getattr(config.option, "testrunuid", None) is None
    ):
        config.option.testrunuid = uuid.uuid4().hex


def pytest_unconfigure(config: pytest.Config) -> None:
    run = getattr(config.option, "testrunuid", None)
    if run and not hasattr(config, "workerinput"):
        shutil.rmtree(_lock_folder(run), ignore_errors=True)


def _lock(path: Path, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, mode)
    return fd


_HELD: tuple[int, int] | None = None
"""The exclusive locks (main, gate) a serial test kept for the serial test after it."""


def _is_serial(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("serial") is not None


FAST_EXIT = Path(__file__).parent / "fast_exit"
"""A folder whose ``sitecustomize`` freezes the garbage collector at a process's exit (see its
docstring): first on ``PYTHONPATH`` for every process the tests start."""


def pytest_collection_finish(session: pytest.Session) -> None:
    """The processes the tests start end without the interpreter's last garbage collections
    (:data:`FAST_EXIT`), unless every test of this run is a compatibility cell (``-m
    compat``): those end as they would anywhere."""
    if any(item.get_closest_marker("compat") is None for item in session.items):
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if str(FAST_EXIT) not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(FAST_EXIT), *filter(None, paths)])


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test marked ``serial`` runs alone: while it (with its fixtures) runs, no other worker
    of this run runs a test; it waits for the running ones to end, and new ones wait for it. A
    readers-writer lock over two files of this run (``flock``): every test holds ``main``
    shared, a serial test exclusively; ``gate`` makes a waiting serial test go first. A serial
    test followed by another on its worker hands its locks on (the others would otherwise start
    tests between the two, which the second then waits for). ``MESHPROF_TEST_LOCK_LOG``: a file
    that gets one line per test, ``nodeid serial waited_s held_s``."""
    global _HELD
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:  # one process: tests run one at a time anyway
        yield
        return
    folder = _lock_folder(run)
    folder.mkdir(exist_ok=True)
    serial = _is_serial(item)
    t0 = time.monotonic()
    main = gate = -1
    if serial and _HELD is not None:
        main, gate = _HELD
        _HELD = None
    try:
        if main < 0:
            gate = _lock(folder / "gate", fcntl.LOCK_EX)
            main = _lock(folder / "main", fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        if not serial:
            os.close(gate)  # (closing the descriptor releases its lock)
            gate = -1
        t1 = time.monotonic()
        yield
        if serial and _is_serial(nextitem):
            _HELD, main, gate = (main, gate), -1, -1
    finally:
        for fd in (main, gate):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
    log = os.environ.get("MESHPROF_TEST_LOCK_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{item.nodeid} {int(serial)} {t1 - t0:.3f} {time.monotonic() - t1:.3f}\n")
