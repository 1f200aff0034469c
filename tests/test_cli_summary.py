"""``meshprof summary FILE``: run the real command line on a real export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshprof.api import CommProfiler
from meshprof.config import ProfilerConfig
from meshprof.events import OP_CODES, GroupInfo


@pytest.fixture
def export(tmp_path: Path) -> Path:
    prof = CommProfiler(ProfilerConfig())
    g = prof.log.group_index(GroupInfo("0", "default_pg", (0, 1, 2, 3), "gloo"))
    d = prof.log.dtype_code("float32")
    durs = [1_000_000, 2_000_000, 3_000_000]
    for i, dur in enumerate(durs):
        prof.log.append(
            (
                OP_CODES["all_reduce"],
                0,
                d,
                0,
                g,
                -1,
                i,
                1_000_000,
                1_000_000,
                0,
                dur,
                -1,
                None,
                None,
            )
        )
    prof.log.append(
        (OP_CODES["broadcast"], 1, d, 0, g, -1, 3, 4096, 4096, 0, 500, -1, "RuntimeError: x", None)
    )
    path = tmp_path / "rank0.json"
    prof.export_json(path)
    return path


def test_summary_table(export: Path, cli) -> None:
    r = cli.process("summary", export)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "all_reduce" in out and "broadcast" in out
    assert "2.00 ms" in out  # mean and p50 of 1, 2, 3 ms
    assert "percentiles: exact" in out
    assert "default_pg" in out or " 0 " in out


def test_summary_json(export: Path, cli) -> None:
    r = cli("summary", export, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    by_op = {s["key"]: s for s in data["stats"]["by_op"]}
    ar = by_op["all_reduce"]
    assert ar["count"] == 3 and ar["total_ns"] == 6_000_000
    assert ar["p50_ns"] == float(np.percentile([1e6, 2e6, 3e6], 50))
    # 1 MB in 1, 2, 3 ms on 4 ranks: algbw 1, 0.5, 0.333 GB/s; busbw x 1.5
    assert ar["mean_algbw_gbps"] == pytest.approx((1 + 0.5 + 1 / 3) / 3)
    assert ar["mean_busbw_gbps"] == pytest.approx(1.5 * (1 + 0.5 + 1 / 3) / 3)
    assert by_op["broadcast"]["errors"] == 1
    assert data["meta"]["total_events"] == 4


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "no such file"),
        ("{not json", "not valid JSON"),
        ('{"meta": {}}', "not a meshprof export"),
        ('{"meta": {}, "events": [{"bogus": 1}], "stats": {}}', "malformed"),
        ("[1, 2]", "not a meshprof export"),
    ],
)
def test_summary_bad_input_one_line_exit_2(
    tmp_path: Path, content: str | None, needle: str, cli
) -> None:
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    r = cli("summary", path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("meshprof summary: error:") and needle in lines[0]
    assert r.stdout == ""


def test_summary_directory_is_an_error(tmp_path: Path, cli) -> None:
    r = cli("summary", tmp_path)
    assert r.returncode == 2 and "is a directory" in r.stderr


def test_one_command_imports_only_its_own_module() -> None:
    """``meshprof report …`` builds the report's parser alone (every command module imports
    what its command needs: building them all cost every command's imports); an option or an
    unknown command gets the full parser, which lists every command."""
    import subprocess
    import sys

    code = (
        "import sys; from meshprof.cli import main\n"
        "try: main(['version'])\n"
        "except SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('meshprof.commands.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "['meshprof.commands.version']"
    from meshprof.cli import COMMANDS, command_of

    assert command_of(["build-native", "--json"]) == "build_native"
    assert command_of(["--help"]) is None and command_of([]) is None
    assert command_of(["bogus"]) is None and len(COMMANDS) > 10
