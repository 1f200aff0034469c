"""Shared test fixtures: a clean recorder around every test, and ``cli``, the one way tests run
the ``meshprof`` command line."""

from __future__ import annotations

import os
import subprocess
import sys
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

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    def __call__(self, *args: CliArg) -> subprocess.CompletedProcess[str]:
        from meshprof.cli import main

        argv = [os.fspath(a) for a in args]
        self._capsys.readouterr()  # what the test printed before is not the command's output
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: usage errors (2), --help (0)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
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


@pytest.fixture(autouse=True)
def _reset_meshprof() -> Iterator[None]:
    import meshprof

    meshprof.reset()
    yield
    meshprof.reset()
