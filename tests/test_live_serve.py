"""``meshprof serve``: the live dashboard of a real 2-rank job while it runs (JSON API, the page in
headless Chromium, /metrics) and after it ends (/report); bad input; Ctrl-C."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from live_helpers import settled, wait_for
from meshprof.live.server import LiveServer
from meshprof.records.live import RankLive
from meshprof.render.live_page import render_live_page
from meshprof.rundir.live import write_rank_live

SCRIPTS = Path(__file__).parent / "scripts"
STEPS = 6


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _live(base: str) -> dict[str, Any]:
    status, _, body = _get(base + "/api/live")
    assert status == 200
    return json.loads(body)  # type: ignore[no-any-return]


def _fresh(base: str) -> dict[str, Any]:
    """The first /api/live whose snapshot the server's sampler took after now."""
    t = time.time_ns()
    return wait_for(lambda: (lambda d: d if d["taken_ns"] > t else None)(_live(base)), 30)  # type: ignore[no-any-return]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def _look(exe: str, url: str) -> tuple[str, list[str]]:
    """Load the page in headless Chromium, let its polling run; (DOM, console errors)."""
    p = subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    console = [ln for ln in p.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    return p.stdout, console


def _shown(dom: str) -> tuple[int, int, int]:
    """(steps shown, points of the step-time chart, polls done) in a dumped DOM."""
    steps = re.search(r'id="steps">(\d+)<', dom)
    points = re.search(r'id="chart-step" data-points="(\d+)"', dom)
    polls = re.search(r'data-polls="(\d+)"', dom)
    assert steps and points and polls, dom[:3000]
    return int(steps.group(1)), int(points.group(1)), int(polls.group(1))


def test_history_since_and_page_escaping(tmp_path: Path) -> None:
    now = time.time_ns()
    write_rank_live(tmp_path, RankLive(rank=0, updated_ns=now, interval_s=1.0, step_ns=5))
    live = LiveServer(tmp_path, poll_s=60)  # samples once at start
    first = live.live()
    assert first["tick"] == 1 and [x["step_ns"] for x in first["history"]["0"]] == [5]
    live.sample()  # the same record again: no new sample
    write_rank_live(tmp_path, RankLive(rank=0, updated_ns=now + 1, interval_s=1.0, step_ns=7))
    live.sample()
    d = live.live(since=first["tick"])
    assert d["tick"] == 3 and [x["step_ns"] for x in d["history"]["0"]] == [7]
    assert len(live.live()["history"]["0"]) == 2
    page = render_live_page("<b>run</b>")
    assert "<b>run</b>" not in page and "&lt;b&gt;run&lt;/b&gt;" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched


def test_serve_a_running_job(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out, ctl = tmp_path / "run", tmp_path / "ctl"
    ctl.mkdir()
    exe = _chromium()
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    # the job's metrics port is taken: one warning, the job runs (and serve has /metrics)
    job = cli.start(
        "run",
        "--nproc-per-node",
        "2",
        "-o",
        out,
        "--live-interval",
        "0.25",
        "--metrics-port",
        str(busy.getsockname()[1]),
        "--no-summary",
        SCRIPTS / "metrics_job.py",
        str(STEPS),
        "2",
        "0.02",
        "0.01",
        ctl,
    )
    server = None
    try:
        wait_for(lambda: (out / "manifest.json").exists())
        server = cli.start("serve", out, "--port", "0")
        assert server.stdout is not None
        line = server.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert m, line
        base = m.group(0)

        wait_for(lambda: settled(out, ctl, 0))
        d1 = _fresh(base)
        assert {
            "taken_ns",
            "ended",
            "world_size",
            "ranks",
            "stale",
            "stragglers",
            "alerts",
            "tick",
            "history",
            "history_max",
            "run_dir",
        } <= set(d1)
        assert d1["world_size"] == 2 and not d1["ended"] and d1["stale"] == []
        assert [x["rank"] for x in d1["ranks"]] == [0, 1]
        assert all(x["steps_done"] == STEPS and x["status"] == "running" for x in d1["ranks"])
        sample = d1["history"]["0"][-1]
        assert {"tick", "t_ns", "steps_done", "step_ns", "memory_bytes", "dims"} <= set(sample)
        assert sample["steps_done"] == STEPS and sample["step_ns"] >= 0.95 * 0.03e9
        if exe:
            dom1, console = _look(exe, base + "/")
            assert console == []
            steps1, points1, polls1 = _shown(dom1)
            assert steps1 == STEPS and points1 > 0 and polls1 >= 1
            assert "running: 2 of 2 ranks" in dom1
        # the server keeps sampling: the history grows while the ranks keep publishing
        n1 = len(d1["history"]["0"])
        wait_for(lambda: len(_live(base)["history"]["0"]) > n1 + 1, timeout=30)

        (ctl / "go0").write_text("")
        wait_for(lambda: settled(out, ctl, 1))
        _fresh(base)
        if exe:
            dom2, console = _look(exe, base + "/")
            assert console == []
            steps2, points2, _ = _shown(dom2)
            assert steps2 == 2 * STEPS and points2 > points1
        status, _, body = _get(base + "/metrics")
        assert status == 200
        counts = re.findall(
            r'meshprof_collectives_total\{dim="\w+",node="[^"]*",op="all_reduce",rank="(\d)"\} (\S+)',
            body.decode(),
        )
        assert sorted((r, float(v)) for r, v in counts) == [("0", 12.0), ("1", 12.0)]

        (ctl / "go1").write_text("")
        outs = job.communicate(timeout=120)
        assert job.returncode == 0, outs[1][-2000:]
        warn = [ln for ln in outs[1].splitlines() if "metrics" in ln]
        assert len(warn) == 1 and "warning" in warn[0], warn

        done = wait_for(lambda: (lambda d: d if d["ended"] else None)(_live(base)), timeout=30)
        assert all(x["status"] == "ended" for x in done["ranks"])
        status, headers, report = _get(base + "/report")
        assert status == 200 and headers["X-Meshprof-Report"] == "built"
        assert b'id="summary"' in report and b"meshprof report" in report
        status, headers, again = _get(base + "/report")
        assert headers["X-Meshprof-Report"] == "cached" and again == report
        if exe:
            dom3, console = _look(exe, base + "/")
            assert console == [] and "the run has ended" in dom3 and 'href="/report"' in dom3

        server.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = server.communicate(timeout=30)
        assert server.returncode == 0 and "Traceback" not in err and "stopped" in err, err
    finally:
        busy.close()
        for p in range(2):
            (ctl / f"go{p}").write_text("")
        for proc in (job, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=60)


def test_serve_bad_input(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for bad in (tmp_path / "missing", tmp_path):  # missing; a directory that is not a run
        p = cli("serve", bad, "--port", "0")
        assert p.returncode == 2 and "not a meshprof run directory" in p.stderr
        assert len(p.stderr.splitlines()) == 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        p = cli("serve", run, "--port", str(s.getsockname()[1]))
    assert p.returncode == 2 and "cannot listen on 127.0.0.1:" in p.stderr
    assert len(p.stderr.splitlines()) == 1


def test_history_is_capped_over_all_ranks() -> None:
    from meshprof.live.server import HISTORY_LEN, HISTORY_MIN, HISTORY_TOTAL, LiveHistory
    from meshprof.records.live import LiveSnapshot

    def snap(n: int, t: int) -> LiveSnapshot:
        ranks = {r: RankLive(rank=r, updated_ns=t, interval_s=1.0) for r in range(n)}
        return LiveSnapshot(t, ranks, [], [], [], False, n)

    h = LiveHistory()
    for t in range(HISTORY_LEN + 5):
        h.add(snap(8, t + 1))
    assert h.maxlen == HISTORY_LEN and len(h.to_dict()["7"]) == HISTORY_LEN
    h.add(snap(200, 10**6))  # more ranks appear: every rank keeps fewer
    assert h.maxlen == HISTORY_TOTAL // 200 and len(h.to_dict()["0"]) == HISTORY_TOTAL // 200
    h.add(snap(10**5, 10**7))
    assert h.maxlen == HISTORY_MIN


def test_finished_run_without_live_records(tmp_path: Path) -> None:
    import threading

    from meshprof.live.server import make_server

    (tmp_path / "manifest.json").write_text(json.dumps({"status": "ok"}))
    srv = make_server(LiveServer(tmp_path, poll_s=60), "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        d = _live(base)
        assert d["run_status"] == "ok" and d["ranks"] == [] and not d["ended"]
        status, _, _ = _get(base + "/report")
        assert status == 404  # no rank files: a page that says so
        exe = _chromium()
        if exe:
            dom, console = _look(exe, base + "/")
            assert console == [] and "left no live records" in dom
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("path", ["/nope", "/api/live?since=x"])
def test_unknown_paths_and_bad_queries(tmp_path: Path, path: str) -> None:
    import threading

    from meshprof.live.server import make_server

    write_rank_live(tmp_path, RankLive(rank=0, updated_ns=time.time_ns(), interval_s=1.0))
    srv = make_server(LiveServer(tmp_path, poll_s=60), "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        status, _, body = _get(f"http://127.0.0.1:{srv.server_address[1]}{path}")
        if path == "/nope":
            assert status == 404
        else:  # a bad "since" is the whole history
            assert status == 200 and len(json.loads(body)["history"]["0"]) == 1
    finally:
        srv.shutdown()
        srv.server_close()


def test_head_answers_like_get_without_a_body(tmp_path: Path) -> None:
    import http.client
    import threading

    from meshprof.live.server import make_server

    pytest.importorskip("prometheus_client")
    write_rank_live(tmp_path, RankLive(rank=0, updated_ns=time.time_ns(), interval_s=1.0))
    srv = make_server(LiveServer(tmp_path, poll_s=60), "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=20)
        for path in ("/metrics", "/", "/api/live"):  # one kept-alive connection: HEAD, GET
            conn.request("HEAD", path)
            head = conn.getresponse()
            assert head.status == 200 and head.read() == b"", path
            length = int(head.headers["Content-Length"])
            conn.request("GET", path)
            get = conn.getresponse()
            body = get.read()
            assert get.status == 200 and len(body) == int(get.headers["Content-Length"]) > 0
            assert head.headers["Content-Type"] == get.headers["Content-Type"]
            if path == "/metrics":
                assert length > 0 and b"meshprof_rank_up" in body
        conn.request("HEAD", "/nope")
        assert conn.getresponse().status == 404
    finally:
        srv.shutdown()
        srv.server_close()
