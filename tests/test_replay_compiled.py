"""The what-if replay's level loop in C (``analyze/run/replay/replay_levels.c`` through ``replay_c``)
gives exactly what the numpy loop gives (the reference, itself checked against the synthetic
runs' own step ends in ``test_what_if.py``), in one block or many; without a compiler the
numpy loop runs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from meshprof import native_build
from meshprof.analyze.run.replay import replay_native as replay_c
from meshprof.report.analysis import analyze_run
from meshprof.rundir import load_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synth_run import write_run

from meshprof.report.stages.what_if import WHAT_IF_REPLAY

MS = 1_000_000


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """replay_c with nothing loaded yet, building into this test's own cache."""
    monkeypatch.setattr(replay_c, "_tried", False)
    monkeypatch.setattr(replay_c, "_loaded", None)
    monkeypatch.setenv("MESHPROF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MESHPROF_REPLAY", raising=False)
    return replay_c


def _what_if(run_dir: Path) -> Any:
    return analyze_run(load_run(run_dir, lean=True))[WHAT_IF_REPLAY]


@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)
@pytest.mark.parametrize(
    ("n", "layout", "extra"),
    [
        (8, (1, 4, 2), {2: 3 * MS}),  # pipeline pairs, a slow rank
        (16, (2, 4, 2), {5: 3 * MS, 13: 1 * MS}),  # two slow ranks in different replicas
    ],
)
def test_compiled_loop_equals_numpy(
    fresh: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, n: int, layout: Any, extra: Any
) -> None:
    write_run(tmp_path / "run", n, collectives=600, steps=4, slow=0.0, seed=3, layout=layout,
              extra_ns=extra)  # fmt: skip
    compiled = _what_if(tmp_path / "run")
    assert fresh.load() is not None, "the C loop should build here"
    assert compiled.note == "" and compiled.levels > 10
    monkeypatch.setattr(replay_c, "BLOCK_MEMBERS", 64)  # many blocks of whole levels
    assert _what_if(tmp_path / "run") == compiled
    monkeypatch.setenv("MESHPROF_REPLAY", "numpy")
    reference = _what_if(tmp_path / "run")
    assert reference == compiled
    assert compiled.ranks[0].rank == max(extra, key=lambda r: extra[r])


def test_without_a_compiler_the_numpy_loop_runs(
    fresh: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(native_build, "c_compiler", lambda: None)
    assert fresh.load() is None
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*.so"))
    write_run(tmp_path / "run", 8, collectives=200, steps=3, slow=0.0, seed=1, layout=(1, 4, 2),
              extra_ns={2: 2 * MS})  # fmt: skip
    assert _what_if(tmp_path / "run").ranks[0].rank == 2


def test_a_failed_build_or_forced_numpy_gives_none(
    fresh: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(native_build, "c_compiler", lambda: "/bin/false")  # a compiler that fails
    assert fresh.load() is None
    monkeypatch.setattr(replay_c, "_tried", False)
    monkeypatch.setenv("MESHPROF_REPLAY", "numpy")
    assert fresh.load() is None
