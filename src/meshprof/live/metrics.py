"""Prometheus metrics of a running job, read from its live state at scrape time.

:class:`LiveCollector` is a ``prometheus_client`` custom collector: each scrape reads the rank
records in ``RUN_DIR/live/`` (:mod:`meshprof.rundir.live`) and turns them into metric families.
Nothing runs in the training processes for it: the ranks publish their records anyway, and a
process that is not scraped does no work.

``meshprof run --metrics-port PORT`` serves ``/metrics`` from each node's launcher for the ranks
of that node (:func:`start_exporter`); ``meshprof serve`` serves it for the whole run.

Metrics (labels ``rank``, ``node`` — the rank's host name — and where they apply ``op``,
``dim``); times in seconds, memory in bytes:

* ``meshprof_rank_up`` — 1 while the rank publishes fresh records, 0 once stale or ended;
* ``meshprof_step_seconds`` — median of the recent steps' durations (absent before a step);
* ``meshprof_steps_total``, ``meshprof_steps_per_second``, ``meshprof_tokens_per_second``;
* ``meshprof_collectives_total{op,dim}`` and the latency histogram
  ``meshprof_collective_seconds{op,dim}`` (``_bucket{le}``, ``_sum``, ``_count``; bounds
  :data:`~meshprof.records.live.HIST_BOUNDS_S`);
* ``meshprof_comm_ratio{dim}``, ``meshprof_comm_exposed_ratio{dim}`` — communication and its
  exposed part over the recent steps' time;
* ``meshprof_memory_bytes`` (``_peak_bytes``, ``_capacity_bytes``): device memory allocated
  (CUDA) or the process RSS (CPU) at the last step end;
* ``meshprof_inflight_seconds`` — age of the oldest collective in flight now (the record's age
  plus its age when written; 0 when none): the hang alarm;
* ``meshprof_compute_seconds`` — median over the recent steps of step time − exposed
  communication (absent before a step): the straggler's figure;
* ``meshprof_storage_writing`` — 1 while the rank writes its files to the run directory, 0 once
  writing stopped (a full or failing disk: training goes on);
* ``meshprof_straggler_score`` — the rank's compute over the median of its peers' (the other
  fresh ranks of its pipeline stage that this endpoint serves;
  :func:`~meshprof.analyze.live.snapshot.straggler_scores`): the culprit stands out where step
  time cannot (every rank of a synchronous job steps as slowly as the slowest);
* ``meshprof_wait_seconds`` — per step, how long the rank waits for the slowest peer
  (:func:`~meshprof.analyze.live.snapshot.wait_estimates`);
* ``meshprof_badput_seconds_total{cause}``, ``meshprof_goodput_seconds_total`` and
  ``meshprof_wall_seconds_total`` — the rank's wall time since it started recording split into
  the report's time-ledger causes (:class:`~meshprof.records.ledger.TimeCause`; compute is the
  goodput), the straggler wait carved out across ranks (:mod:`meshprof.analyze.live.badput`):
  ``sum by (rank) (badput) + goodput == wall``.

A serving job's families (vLLM's names after ``meshprof_``: TTFT, ITL, TPOT, E2E histograms,
request and token counters, running and waiting requests, goodput, SLO attainment, decode
stragglers) are in :mod:`meshprof.live.serving_metrics`.

Alerting rules over these, evaluated by Prometheus across every node's endpoint (a straggler on
one node against the job's median), ship as ``meshprof/live/prometheus_rules.yml``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshprof.analyze.live.badput import BadputBook
from meshprof.analyze.live.snapshot import carvable_exposed_ns, straggler_scores, wait_estimates
from meshprof.errors import MeshprofError
from meshprof.live.serving_metrics import serving_families
from meshprof.records.ledger import TimeCause
from meshprof.records.live import HIST_BOUNDS_S, RankLive
from meshprof.rundir.live import manifest_done, read_rank_lives


def _le(bound: float) -> str:
    return repr(float(bound))


class LiveCollector:
    """A ``prometheus_client`` collector over a run directory's live state.

    ``node_id``: only the ranks whose records carry this node id (records without a node id
    are always included); None: every rank."""

    def __init__(self, run_dir: str | os.PathLike[str], node_id: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.node_id = node_id
        self._foreign: set[int] = set()
        """Ranks seen on other nodes: their files are not read again (ranks keep their node)."""
        self.badput = BadputBook()
        """The straggler wait carved so far (keep one collector per endpoint)."""
        self._lock = threading.Lock()
        """Scrapes of one endpoint run one at a time (they fold :attr:`badput`)."""

    def records(self) -> tuple[dict[int, RankLive], set[int], int]:
        """This collector's rank records, the stale ones among them and the time read (ns)."""
        recs = read_rank_lives(self.run_dir, only=lambda r: r not in self._foreign)
        if self.node_id is not None:
            for r, x in list(recs.items()):
                if x.node_id and x.node_id != self.node_id:
                    self._foreign.add(r)
                    del recs[r]
        now = time.time_ns()
        done = manifest_done(self.run_dir)
        stale = set() if done else {r for r, x in recs.items() if x.is_stale(now)}
        return recs, stale, now

    def describe(self) -> list[Any]:
        """No description up front (the families depend on the run): scraped on demand."""
        return []

    def collect(self) -> Iterator[Any]:
        """The metric families now (called by ``prometheus_client`` at each scrape)."""
        with self._lock:
            families = list(self._collect())
        yield from families

    def _collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        recs, stale, _now = self.records()
        rl = ["rank", "node"]
        up = GaugeMetricFamily("meshprof_rank_up", "1: the rank publishes fresh records", labels=rl)
        step = GaugeMetricFamily(
            "meshprof_step_seconds", "median duration of the recent steps", labels=rl
        )
        steps = CounterMetricFamily("meshprof_steps", "steps completed", labels=rl)
        sps = GaugeMetricFamily(
            "meshprof_steps_per_second", "steps per second over the recent steps", labels=rl
        )
        tps = GaugeMetricFamily(
            "meshprof_tokens_per_second", "tokens per second over the recent steps", labels=rl
        )
        coll = CounterMetricFamily(
            "meshprof_collectives", "collectives completed", labels=[*rl, "op", "dim"]
        )
        hist = HistogramMetricFamily(
            "meshprof_collective_seconds",
            "collective duration, issue to completion",
            labels=[*rl, "op", "dim"],
        )
        comm = GaugeMetricFamily(
            "meshprof_comm_ratio",
            "communication time / step time over the recent steps",
            labels=[*rl, "dim"],
        )
        exposed = GaugeMetricFamily(
            "meshprof_comm_exposed_ratio",
            "exposed (not overlapped) communication / step time over the recent steps",
            labels=[*rl, "dim"],
        )
        mem = GaugeMetricFamily(
            "meshprof_memory_bytes",
            "device memory allocated (CUDA) or process RSS (CPU) at the last step end",
            labels=rl,
        )
        peak = GaugeMetricFamily("meshprof_memory_peak_bytes", "peak memory", labels=rl)
        cap = GaugeMetricFamily("meshprof_memory_capacity_bytes", "memory in total", labels=rl)
        inflight = GaugeMetricFamily(
            "meshprof_inflight_seconds",
            "age of the oldest collective in flight (0: none)",
            labels=rl,
        )
        compute = GaugeMetricFamily(
            "meshprof_compute_seconds",
            "median over the recent steps of step time minus exposed communication",
            labels=rl,
        )
        storage = GaugeMetricFamily(
            "meshprof_storage_writing",
            "1 while the rank writes its files, 0 once writing stopped (full or failing disk)",
            labels=rl,
        )
        score = GaugeMetricFamily(
            "meshprof_straggler_score",
            "recent compute / the median of the other fresh ranks' of its pipeline stage",
            labels=rl,
        )
        wait = GaugeMetricFamily(
            "meshprof_wait_seconds",
            "per step, the wait for the slowest rank of its stage (recent medians, estimate)",
            labels=rl,
        )
        badput = CounterMetricFamily(
            "meshprof_badput_seconds",
            "wall time lost since the rank started recording, by cause (the report's ledger)",
            labels=[*rl, "cause"],
        )
        goodput = CounterMetricFamily(
            "meshprof_goodput_seconds",
            "wall time in productive compute since the rank started recording",
            labels=rl,
        )
        wall = CounterMetricFamily(
            "meshprof_wall_seconds",
            "wall time the ledger covers: goodput + every badput cause",
            labels=rl,
        )
        scores = straggler_scores(recs, stale)
        waits = wait_estimates(recs, stale)
        for r, x in recs.items():
            lab = [str(r), x.hostname or x.node_id]
            if r in scores:
                score.add_metric(lab, scores[r])
            if r in waits:
                wait.add_metric(lab, waits[r] / 1e9)
            parts = self.badput.update(x, waits.get(r, 0), carvable_exposed_ns(x))
            if parts:
                for c in TimeCause:
                    if c.badput:
                        badput.add_metric([*lab, c.value], parts.get(c, 0) / 1e9)
                goodput.add_metric(lab, parts.get(TimeCause.COMPUTE, 0) / 1e9)
                wall.add_metric(lab, x.ledger_wall_ns / 1e9)
            if x.compute_ns > 0:
                compute.add_metric(lab, x.compute_ns / 1e9)
            storage.add_metric(lab, 0.0 if x.storage else 1.0)
            running = x.status == "running"
            up.add_metric(lab, 1.0 if running and r not in stale else 0.0)
            if x.step_ns > 0:
                step.add_metric(lab, x.step_ns / 1e9)
            steps.add_metric(lab, float(x.steps_done))
            sps.add_metric(lab, float(x.steps_per_s))
            tps.add_metric(lab, float(x.tokens_per_s))
            for s in x.series:
                ol = [*lab, s.op, s.dim]
                coll.add_metric(ol, float(s.count))
                hist.add_metric(ol, _buckets(s.buckets), sum_value=s.sum_ns / 1e9)
            for d in x.dims:
                comm.add_metric([*lab, d.dim], float(d.comm_share))
                exposed.add_metric([*lab, d.dim], float(d.exposed_share))
            for fam, v in ((mem, x.memory_bytes), (peak, x.memory_peak_bytes)):
                if v >= 0:
                    fam.add_metric(lab, float(v))
            if x.memory_capacity_bytes > 0:
                cap.add_metric(lab, float(x.memory_capacity_bytes))
            age = 0.0
            if x.inflight is not None and running:
                age = x.inflight.age_ns / 1e9  # from its issue time to the record's time
            inflight.add_metric(lab, age)
        yield from (up, step, steps, sps, tps, coll, hist, comm, exposed, mem, peak, cap, inflight)
        yield from (compute, storage, score, wait, badput, goodput, wall)
        yield from serving_families(recs, stale)


def _buckets(counts: list[int]) -> list[tuple[str, float]]:
    """Cumulative ``le`` buckets from the record's per-bucket counts (the last is +Inf)."""
    out = []
    acc = 0
    for bound, c in zip((*HIST_BOUNDS_S, float("inf")), counts, strict=False):
        acc += int(c)
        out.append(("+Inf" if bound == float("inf") else _le(bound), float(acc)))
    if len(out) < len(HIST_BOUNDS_S) + 1:  # a shorter record (another bounds version)
        out.append(("+Inf", float(acc)))
    return out


def metrics_text(collector: LiveCollector) -> tuple[bytes, str]:
    """One scrape as the Prometheus text format: (body, content type)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def metrics_available() -> bool:
    """``prometheus_client`` is installed (the ``metrics`` extra)."""
    import importlib.util

    return importlib.util.find_spec("prometheus_client") is not None


def check_metrics_options(port: int, live_interval_s: float) -> None:
    """``meshprof run --metrics-port``'s checks (:class:`MeshprofError` on bad input)."""
    if not 0 < port < 65536:
        raise MeshprofError(f"--metrics-port {port}: expected a TCP port (1-65535)")
    if not live_interval_s > 0:
        raise MeshprofError("--metrics-port needs the live state (a --live-interval above 0)")
    if not metrics_available():
        raise MeshprofError(
            "--metrics-port needs prometheus-client (pip install 'meshprof[metrics]')"
        )


@dataclass(slots=True)
class Exporter:
    """A running ``/metrics`` endpoint (``prometheus_client``'s HTTP server in a daemon thread)."""

    server: Any
    thread: Any
    port: int

    def stop(self) -> None:
        """Stop serving and close the socket."""
        try:
            self.server.shutdown()
            self.server.server_close()
        except Exception:
            pass


def start_exporter(
    run_dir: str | os.PathLike[str], port: int, addr: str = "127.0.0.1", node_id: str | None = None
) -> Exporter | None:
    """Serve ``/metrics`` for ``run_dir``'s ranks on ``node_id`` at ``addr:port`` (GET, and
    HEAD: the same status and headers, no body). A port that cannot be bound is one warning
    line on stderr and None: the job runs without metrics."""
    try:
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(LiveCollector(run_dir, node_id))
        server = _wsgi_server(addr, port, _head_as_get(_metrics_app(registry)))
    except Exception as e:
        why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        print(
            f"meshprof run: warning: cannot serve metrics on {addr}:{port} ({why}); "
            "the job runs without them",
            file=sys.stderr,
        )
        return None
    thread = threading.Thread(target=server.serve_forever, name="meshprof-metrics", daemon=True)
    thread.start()
    return Exporter(server, thread, int(server.server_address[1]))


def _metrics_app(registry: Any) -> Any:
    from prometheus_client import make_wsgi_app

    return make_wsgi_app(registry)


def _head_as_get(app: Any) -> Any:
    """A WSGI app that answers HEAD as ``app`` answers GET, without the body
    (``prometheus_client``'s answers it 405)."""

    def head_as_get(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        got: list[Any] = []
        body = b"".join(app({**environ, "REQUEST_METHOD": "GET"}, lambda *a: got.append(a)))
        status, headers = got[0][0], list(got[0][1])
        if not any(k.lower() == "content-length" for k, _ in headers):
            headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [b""]

    return head_as_get


def _wsgi_server(addr: str, port: int, app: Any) -> Any:
    """A threading WSGI server bound to ``addr:port``, quiet (no access log)."""
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    return make_server(addr, port, app, Server, handler_class=Quiet)


__all__ = [
    "Exporter",
    "LiveCollector",
    "check_metrics_options",
    "metrics_available",
    "metrics_text",
    "start_exporter",
]
