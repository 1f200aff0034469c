"""The HTML report: self-contained, escaped, and rendered by headless Chromium without console
errors."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from data.meshprof_synth import real_worker
from meshprof.analyze.steps.rules import Bottleneck
from meshprof.launch.spawn import run_ranks
from meshprof.records.finding import FindingKind, Severity
from meshprof.render.html import render_html
from meshprof.report.analysis import analyze_run
from meshprof.rundir import load_run

EVIL = "<script>alert(1)</script>"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    run_ranks(real_worker, 2, (str(d), 1, 0.03, 4, EVIL), timeout=90)
    rep = analyze_run(
        load_run(d),
        bottlenecks=(
            Bottleneck(
                kind=FindingKind.COMMUNICATION,
                severity=Severity.HIGH,
                rule="exposed <i>comm</i>",
                value=0.4,
                threshold=0.3,
                title="share 0.4",
                suggestion="",
            ),
        ),
    )
    return d, rep


def test_html_is_self_contained_and_escaped(report):
    _, rep = report
    doc = render_html(rep)
    assert EVIL not in doc and "&lt;script&gt;alert(1)&lt;/script&gt;" in doc  # op label
    assert "<b>&amp;amp;" not in doc and "&lt;b&gt;&amp;amp;" in doc  # hostname
    assert "exposed &lt;i&gt;comm&lt;/i&gt;" in doc
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", doc)
    assert doc.count("<script>") == 1
    for section in (
        "summary",
        "heatmap",
        "comm-dims",
        "latency",
        "scores",
        "timeline",
        "straggler-1",
    ):
        assert f'id="{section}"' in doc, section


def test_html_renders_in_headless_chromium(report, tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not found on PATH (Debian: apt-get install chromium)")
    _, rep = report
    page = tmp_path / "report.html"
    page.write_text(render_html(rep), encoding="utf-8")
    p = subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    dom = p.stdout
    assert p.returncode == 0, p.stderr[-2000:]
    assert "interactive: click a column header to sort" in dom  # the inline script ran
    assert "Straggler: <b>rank 1</b>" in dom and "forward" in dom
    assert dom.count("<rect") > 20
    console = [ln for ln in p.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert console == []
    assert "<script>alert(1)" not in dom
