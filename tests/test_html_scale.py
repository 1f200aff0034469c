"""The HTML report at 1,024 ranks: a few MB at most, its tables capped with a working "show all",
its heatmaps drawn on a canvas by the page's own script — checked in headless Chromium's DOM and
in the pixels of its screenshot, where the slow rank's row (the generator's truth, not the
analysis') must be the reddest of the phase heatmap."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meshprof.render.html import render_html
from meshprof.report.analysis import analyze_run
from meshprof.rundir import load_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synth_run import write_run

N = 1024
SLOW = 517
#: What a 1,024-rank report may weigh: it opens in a browser in a second or two.
MAX_BYTES = 5 * 1024 * 1024


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("run1024")
    write_run(d, N, collectives=80, steps=4, slow_rank=SLOW, seed=1, layout=(32, 4, 8))
    doc = render_html(analyze_run(load_run(d)))
    p = d / "report.html"
    p.write_text(doc, encoding="utf-8")
    return p


def _browser(exe: str, args: list[str], timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_size_and_capped_tables(page):
    doc = page.read_text(encoding="utf-8")
    assert len(doc.encode()) <= MAX_BYTES, len(doc.encode())
    # The per-rank table shows 20 rows (the ranks that stand out), the others travel as JSON.
    m = re.search(r'<table id="ranks-table".*?</table>', doc, re.S)
    assert m is not None
    assert m.group(0).count("<tr") == 21  # header + 20
    assert f'<td data-v="{SLOW}">{SLOW}</td>' in m.group(0).split("</tr>")[1]  # the first row
    assert "show all 1,024 rows" in doc
    assert doc.count('<canvas class="heatmap"') == 2


def test_browser_draws_heatmaps_and_shows_all_rows(page, tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not found on PATH (Debian: apt-get install chromium)")
    doc = page.read_text(encoding="utf-8")
    clicked = tmp_path / "clicked.html"
    clicked.write_text(
        doc.replace(
            "</body>",
            "<script>document.querySelectorAll('button.show-all')"
            ".forEach(function(b){b.click();});</script></body>",
        ),
        encoding="utf-8",
    )
    p = _browser(exe, ["--dump-dom", clicked.as_uri()])
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout
    assert "interactive: click a column header to sort" in dom  # the page's script ran
    assert dom.count('data-drawn="1"') == 2
    m = re.search(r'<table id="ranks-table".*?</table>', dom, re.S)
    assert m is not None and m.group(0).count("<tr") == N + 1
    console = [ln for ln in p.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert console == []


def test_screenshot_slow_rank_is_the_reddest_row(page, tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not found on PATH (Debian: apt-get install chromium)")
    Image = pytest.importorskip("PIL.Image")
    doc = page.read_text(encoding="utf-8")
    # Pin the phase heatmap to the page's top-left corner, one CSS pixel a cell row.
    pinned = tmp_path / "pinned.html"
    pinned.write_text(
        doc.replace(
            "</head>",
            "<style>#phase-heatmap{position:fixed;left:0;top:0;border:0;z-index:9;"
            "width:96px;height:1024px}</style></head>",
        ),
        encoding="utf-8",
    )
    shot = tmp_path / "shot.png"
    p = _browser(
        exe,
        [
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--window-size=400,1100",
            "--virtual-time-budget=5000",
            f"--screenshot={shot}",
            pinned.as_uri(),
        ],
    )
    assert p.returncode == 0 and shot.exists(), p.stderr[-2000:]
    px = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int32)[:N, :96]
    cols = json.loads(
        html.unescape(re.search(r'id="phase-heatmap"[^>]*data-cols=\'([^\']*)\'', doc).group(1))
    )
    cw = 96 // len(cols)
    # Redness: how far green and blue fall below red (0 for white and grey), per cell row.
    red = px[..., 0] - (px[..., 1] + px[..., 2]) / 2
    assert red.max() > 150, red.max()  # drawn, not blank
    j = cols.index("forward")  # the generator slows the slow rank's forward compute
    fwd = red[:, j * cw : (j + 1) * cw - 1].mean(axis=1)
    assert int(np.argmax(fwd)) == SLOW, (int(np.argmax(fwd)), fwd[SLOW], float(np.median(fwd)))
    assert fwd[SLOW] > 3 * max(float(np.median(fwd)), 1.0)
