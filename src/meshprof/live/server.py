"""``meshprof serve``'s web server: the live dashboard of a run directory.

Standard library only (:class:`http.server.ThreadingHTTPServer`): the dashboard is one page, a
JSON endpoint polled once a second and two on-demand documents, served to a handful of people on
a login node; a web framework would add a dependency and nothing this needs.

Routes:

* ``/`` — the dashboard (:func:`meshprof.render.live_page.render_live_page`: one self-contained
  page, inline JS/CSS/SVG, nothing fetched from the network);
* ``/api/live[?since=TICK]`` — :func:`~meshprof.analyze.live.snapshot.snapshot_to_dict` of the latest
  snapshot plus ``run_dir``, ``run_status`` (the manifest's: running, ok, failed, hang; ""
  without one), ``tick`` (the sampler's counter), ``history_max`` and ``history``:
  per rank (key: the rank as a string) the samples the server kept (at most ``history_max``:
  :data:`HISTORY_LEN`, fewer in a large run; oldest first), each ``{tick, t_ns, steps_done,
  step_ns, steps_per_s, tokens_per_s, comm_share, exposed_share, memory_bytes, dims: {dim: comm
  share}}``; with
  ``since``, only the samples of later ticks;
* ``/metrics`` — the Prometheus text of every rank (:mod:`meshprof.live.metrics`);
* ``/report`` — ``meshprof report``'s HTML of the run, built on demand from the rank files and
  cached until they change.

Every route answers ``HEAD`` as ``GET`` — the same status and headers (``Content-Length``
included), no body — so uptime checks and Prometheus' probes see 200.

A sampler thread reads the run's live state every ``poll_s`` seconds (one read however many
pages poll; less often when a read takes more than half of that) and appends a sample for each
rank whose record changed.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import socket
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from meshprof.analyze.live.snapshot import read_snapshot, snapshot_to_dict
from meshprof.errors import MeshprofError
from meshprof.records.live import LiveSnapshot
from meshprof.rundir.json_file import read_json
from meshprof.rundir.live import live_dir

#: Samples kept per rank (at one a second: five minutes).
HISTORY_LEN = 300
#: Samples kept over all ranks (a large run keeps fewer per rank: the first page load stays a
#: few MiB), and the fewest per rank.
HISTORY_TOTAL = 20_000
HISTORY_MIN = 30


def is_run_dir(path: Path) -> bool:
    """A meshprof run directory (or one a job is starting in): a manifest, live records or rank
    files."""
    if not path.is_dir():
        return False
    if (path / "manifest.json").is_file() or live_dir(path).is_dir():
        return True
    return any(path.glob("rank*.npz"))


def _finite(x: float, digits: int = 12) -> float:
    return round(x, digits) if math.isfinite(x) else 0.0


def _clean(v: Any) -> Any:
    """``v`` with NaN/inf floats replaced by 0 (JSON.parse rejects them)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else 0.0
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


class LiveHistory:
    """The last samples of each rank, taken from successive snapshots: :data:`HISTORY_LEN` per
    rank, fewer in a large run so that all ranks together keep at most :data:`HISTORY_TOTAL`
    (but at least :data:`HISTORY_MIN` each)."""

    def __init__(self, maxlen: int = HISTORY_LEN) -> None:
        self.limit = maxlen
        self.maxlen = maxlen
        self.tick = 0
        self._rows: dict[int, deque[dict[str, Any]]] = {}
        self._last: dict[int, int] = {}

    def _resize(self, ranks: int) -> None:
        n = min(self.limit, max(HISTORY_MIN, HISTORY_TOTAL // max(ranks, 1)))
        if n != self.maxlen:
            self.maxlen = n
            self._rows = {r: deque(rows, maxlen=n) for r, rows in self._rows.items()}

    def add(self, snap: LiveSnapshot) -> None:
        """Append a sample for each rank whose record is newer than its last sample."""
        self.tick += 1
        if len(snap.ranks) != len(self._rows):
            self._resize(max(len(snap.ranks), len(self._rows)))
        for r, x in snap.ranks.items():
            if self._last.get(r) == x.updated_ns:
                continue
            self._last[r] = x.updated_ns
            row = {
                "tick": self.tick,
                "t_ns": x.updated_ns,
                "steps_done": x.steps_done,
                "step_ns": x.step_ns,
                "steps_per_s": _finite(x.steps_per_s, 3),
                "tokens_per_s": _finite(x.tokens_per_s, 1),
                "comm_share": _finite(x.comm_share, 4),
                "exposed_share": _finite(x.exposed_share, 4),
                "memory_bytes": x.memory_bytes,
                "dims": {d.dim: _finite(d.comm_share, 4) for d in x.dims},
            }
            self._rows.setdefault(r, deque(maxlen=self.maxlen)).append(row)

    def to_dict(self, since: int = -1) -> dict[str, list[dict[str, Any]]]:
        """``{rank: [sample, ...]}`` for the samples of ticks after ``since``."""
        return {
            str(r): [row for row in rows if row["tick"] > since] for r, rows in self._rows.items()
        }


class LiveServer:
    """The dashboard's state: the run, the sampler and its history, the cached report."""

    def __init__(self, run_dir: str | os.PathLike[str], poll_s: float = 1.0) -> None:
        self.run_dir = Path(run_dir)
        self.poll_s = poll_s
        self.history = LiveHistory()
        self._snap: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._report_lock = threading.Lock()
        self._report: tuple[Any, str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._collector: Any = None
        self.sample()

    def collector(self) -> Any:
        """The ``/metrics`` collector (one per server: it folds the straggler wait scrape by
        scrape, :class:`~meshprof.analyze.live.badput.BadputBook`)."""
        with self._lock:
            if self._collector is None:
                from meshprof.live.metrics import LiveCollector

                self._collector = LiveCollector(self.run_dir)
            return self._collector

    # -- sampling -------------------------------------------------------------------------------
    def sample(self) -> None:
        """Read the live state now and add it to the history (never raises)."""
        try:
            snap = read_snapshot(self.run_dir)
        except Exception:
            return
        d = _clean(snapshot_to_dict(snap))
        d["run_status"] = _run_status(self.run_dir)
        with self._lock:
            self.history.add(snap)
            d["tick"] = self.history.tick
            self._snap = d

    def start(self) -> LiveServer:
        """Start the sampler thread."""
        self._thread = threading.Thread(target=self._run, name="meshprof-serve", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        wait = self.poll_s
        while not self._stop.wait(wait):
            t0 = time.monotonic()
            self.sample()
            # a large run's read takes a while: sample at most half the time
            wait = max(self.poll_s, 2 * (time.monotonic() - t0))

    def live(self, since: int = -1) -> dict[str, Any]:
        """The ``/api/live`` object."""
        with self._lock:
            out = dict(self._snap)
            out["history"] = self.history.to_dict(since)
        out["run_dir"] = str(self.run_dir)
        out["history_max"] = self.history.maxlen
        out["poll_s"] = self.poll_s
        return out

    # -- the report -----------------------------------------------------------------------------
    def _report_key(self) -> tuple[Any, ...]:
        keys = []
        for p in [*sorted(self.run_dir.glob("rank*.npz")), self.run_dir / "manifest.json"]:
            with contextlib.suppress(OSError):
                st = p.stat()
                keys.append((p.name, st.st_mtime_ns, st.st_size))
        return tuple(keys)

    def report_html(self) -> tuple[int, str, bool]:
        """(HTTP status, document, from the cache): ``meshprof report``'s HTML, rebuilt when
        the rank files or the manifest change."""
        with self._report_lock:
            key = self._report_key()
            if self._report is not None and self._report[0] == key:
                return 200, self._report[1], True
            try:
                from meshprof.render.html import render_html
                from meshprof.report.analysis import analyze_run
                from meshprof.rundir import load_run

                doc = render_html(analyze_run(load_run(self.run_dir), release_events=True))
            except MeshprofError as e:
                return 404, _message_page("No report yet", str(e)), False
            except Exception as e:
                return 500, _message_page("The report failed", f"{type(e).__name__}: {e}"), False
            self._report = (key, doc)
            return 200, doc, False


def _run_status(run_dir: Path) -> str:
    """The manifest's status (running, ok, failed, hang; "" without one)."""
    with contextlib.suppress(OSError, ValueError):
        m = read_json(run_dir / "manifest.json")
        if isinstance(m, dict):
            return str(m.get("status") or "")
    return ""


def _message_page(title: str, text: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}'
        f"</title></head><body><h1>{html.escape(title)}</h1><p>{html.escape(text)}</p>"
        '<p><a href="/">live dashboard</a></p></body></html>\n'
    )


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log on the terminal

    head = False
    """Answering a HEAD request: headers only."""

    def do_HEAD(self) -> None:
        self.head = True
        self._answer()

    def do_GET(self) -> None:
        self.head = False  # (a kept-alive connection's handler answers several requests)
        self._answer()

    def _answer(self) -> None:
        try:
            self._route()
        except Exception as e:  # one bad request never takes the server down
            with contextlib.suppress(Exception):
                msg = f"internal error: {type(e).__name__}: {e}\n".encode()
                self._send(500, msg, "text/plain; charset=utf-8")

    def _route(self) -> None:
        url = urlsplit(self.path)
        live = self.server.live
        if url.path in ("/", "/index.html"):
            from meshprof.render.live_page import render_live_page

            page = render_live_page(str(live.run_dir), poll_ms=int(live.poll_s * 1000))
            self._send(200, page.encode("utf-8"), "text/html; charset=utf-8")
        elif url.path == "/api/live":
            try:
                since = int(parse_qs(url.query).get("since", ["-1"])[0])
            except ValueError:
                since = -1
            body = json.dumps(live.live(since), allow_nan=False).encode("utf-8")
            self._send(200, body, "application/json")
        elif url.path == "/metrics":
            self._metrics()
        elif url.path == "/report":
            status, doc, cached = live.report_html()
            extra = {"X-Meshprof-Report": "cached" if cached else "built"}
            self._send(status, doc.encode("utf-8"), "text/html; charset=utf-8", extra)
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _metrics(self) -> None:
        from meshprof.live.metrics import metrics_available, metrics_text

        if not metrics_available():
            msg = b"prometheus-client is not installed (pip install 'meshprof[metrics]')\n"
            self._send(501, msg, "text/plain; charset=utf-8")
            return
        body, ctype = metrics_text(self.server.live.collector())
        self._send(200, body, ctype)

    def _send(
        self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.head:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    live: LiveServer


def make_server(live: LiveServer, host: str = "127.0.0.1", port: int = 8050) -> _HTTPServer:
    """Bind the dashboard's HTTP server (raises :class:`MeshprofError` when it cannot)."""

    class Server(_HTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    try:
        server = Server((host, port), _Handler)
    except (OSError, OverflowError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise MeshprofError(f"cannot listen on {host}:{port} ({why})") from None
    server.live = live
    return server


def serve_until_interrupted(server: _HTTPServer) -> None:
    """Serve until Ctrl-C (or SIGTERM), then close the socket."""
    try:
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.live.stop()


__all__ = [
    "HISTORY_LEN",
    "HISTORY_MIN",
    "HISTORY_TOTAL",
    "LiveHistory",
    "LiveServer",
    "is_run_dir",
    "make_server",
    "serve_until_interrupted",
]
