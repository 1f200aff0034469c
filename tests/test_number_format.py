"""Every number a person reads is formatted the same way, in every view (issue 38, item 4).

Each view of a few runs (the report's brief and full text, its HTML, the diff's text and HTML)
is rendered by the real CLI and its visible text searched for raw integers: a duration or a size
printed as a bare integer of nanoseconds or bytes (``-3059055 ns``, ``1048576 B``), a
timestamp in ns since the epoch, or any other integer of seven digits or more that no
formatter shortened. Tables with nothing measurable collapse to one sentence.
"""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest

from data.meshprof_synth import MS, synthetic_run

DATA = Path(__file__).parent / "data"

#: A bare integer of nanoseconds or bytes, e.g. "-3059055 ns", "1048576 B", "4096 bytes".
RAW_UNIT = re.compile(r"(?<![\d.,])-?\d{4,}\s?(ns|B|bytes)\b")
#: Any integer of seven digits or more that is not part of a formatted number or a name.
RAW_BIG = re.compile(r"(?<![\w.,/-])\d{7,}(?![\w.,])")


def visible_text(page: str) -> str:
    """What a browser shows of an HTML page (no scripts, styles, tags or attributes)."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def raw_numbers(text: str) -> list[str]:
    found = []
    for rx in (RAW_UNIT, RAW_BIG):
        for m in rx.finditer(text):
            found.append(text[max(0, m.start() - 50) : m.end() + 10].replace("\n", " "))
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fmt")
    out = {
        "straggler": root / "straggler",
        "even": root / "even",
        "ddp_2rank": root / "ddp_2rank",
    }
    synthetic_run(out["straggler"], 4, [0, 3 * MS, -2 * MS, 1 * MS], steps=8, slow_rank=2,
                  extra_ns=4 * MS, collectives=((4096, 1 * MS), (2**20, 2 * MS)),
                  tokens_per_step=8192, mem_rank=1, mem_extra_bytes=300 * 2**20)  # fmt: skip
    synthetic_run(out["even"], 4, [0, 1 * MS, 0, 2 * MS], steps=8)
    shutil.copytree(DATA / "ddp_2rank", out["ddp_2rank"])
    return out


def _views(cli, runs: dict[str, Path], tmp: Path) -> dict[str, str]:
    views: dict[str, str] = {}
    for name, d in runs.items():
        for flag in ((), ("--full",)):
            p = cli("report", d, *flag)
            assert p.returncode == 0, p.stderr
            views[f"report {name} {' '.join(flag)}"] = p.stdout
        page = tmp / f"{name}.html"
        p = cli("report", d, "--html", page)
        assert p.returncode == 0, p.stderr
        views[f"report {name} html"] = visible_text(page.read_text())
    for a, b in (("even", "straggler"), ("straggler", "even")):
        p = cli("diff", runs[a], runs[b])
        assert p.returncode == 0, p.stderr
        views[f"diff {a} {b}"] = p.stdout
        page = tmp / f"diff-{a}-{b}.html"
        p = cli("diff", runs[a], runs[b], "--html", page)
        assert p.returncode == 0, p.stderr
        views[f"diff {a} {b} html"] = visible_text(page.read_text())
    return views


def test_no_view_prints_a_raw_integer(cli, runs: dict[str, Path], tmp_path: Path) -> None:
    views = _views(cli, runs, tmp_path)
    bad = {name: raw_numbers(text) for name, text in views.items()}
    assert {k: v for k, v in bad.items() if v} == {}
    # the checker itself finds what it is there to find
    assert raw_numbers("excess compute -3059055 ns") and raw_numbers(
        "start_ns: 1795844984703544026"
    )
    assert not raw_numbers("3.06 ms, 1,234 collectives, 512.0 MiB, rank 1024, mesh_dp (2)")


def test_what_if_tables_with_nothing_measurable_collapse(
    cli, runs: dict[str, Path], tmp_path: Path
) -> None:
    pages = {}
    for name in ("straggler", "even"):
        page = tmp_path / f"{name}.html"
        assert cli("report", runs[name], "--html", page).returncode == 0
        pages[name] = page.read_text()
    # a straggler costs something: its tables are there, with its row
    assert 'id="what-if-ranks"' in pages["straggler"]
    # nobody costs anything: one sentence, no table of zeros
    assert 'id="what-if-ranks"' not in pages["even"]
    assert "nothing measurable" in visible_text(pages["even"])
