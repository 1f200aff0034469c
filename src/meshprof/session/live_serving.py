"""A serving rank's live figures (:class:`~meshprof.records.serving.ServingLive`), computed on
the live publisher's thread from the rows the request monitor appends (nothing on the serving
thread beyond those appends).

Each publish folds the requests finished and the tokens emitted since the last one into
cumulative histograms (bounded: one count per bucket, for weeks of serving) and into the recent
window (the last :data:`WINDOW_S` seconds: bounded deques, trimmed to it at every publish), from
which the percentiles, rates, error rate and goodput are taken; the definitions are the
report's (docs/definitions.md, Serving). The decode figures come from the step monitor's recent steps named ``decode``: their
median duration and median compute (duration − the union of the step's collectives), on every
rank, so that a rank slow in decode stands out against its peers.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any

import numpy as np

from meshprof.events import FINISH_CODES, FINISH_REASONS, REQUEST_DTYPE, TOKEN_DTYPE
from meshprof.records.serving import (
    HISTOGRAMS,
    SLO_NAMES,
    Histogram,
    ServiceLevels,
    ServingLive,
    WindowFigures,
)
from meshprof.rundir.row_tail import RowTail, rows_since

WINDOW_S = 60.0
"""Seconds of the recent window."""
MAX_RECENT = 50_000
"""Requests (and gaps, and emissions) the window holds at most: at more than this many per
minute, the window's percentiles are over the last 50,000."""
MAX_TRACKED = 100_000
"""Requests whose last emission is remembered at most (for the next gap)."""
_SUCCESS = (FINISH_CODES["stop"], FINISH_CODES["length"])
_ERROR = FINISH_CODES["error"]
_UNFINISHED = FINISH_CODES["unfinished"]
_DECODE_SPANS = 4096
"""Span rows looked at for the recent decode steps."""


def _observe(h: Histogram, values: np.ndarray) -> None:
    """Add ``values`` (seconds or tokens) to ``h`` (a value goes to the first bucket whose
    bound is at or above it: Prometheus' ``le``)."""
    v = values[np.isfinite(values)]
    if not len(v):
        return
    idx = np.searchsorted(np.asarray(h.bounds), v, side="left")
    counts = np.bincount(idx, minlength=len(h.buckets))
    h.buckets = [a + int(b) for a, b in zip(h.buckets, counts.tolist(), strict=True)]
    h.count += len(v)
    h.total += float(v.sum())


class LiveServing:
    """Folds one request monitor's rows into live figures (see the module docstring)."""

    def __init__(self, slo: ServiceLevels | None = None, window_s: float = WINDOW_S) -> None:
        self.slo = slo if slo is not None and not slo.empty else None
        self.window_s = float(window_s)
        self.histograms = {name: Histogram.empty(name) for name in HISTOGRAMS}
        self.good = 0
        self._requests_tail = RowTail()
        self._tokens_tail = RowTail()
        self._last: dict[int, int] = {}
        self._max_gap: dict[int, int] = {}
        # (finish ns, reason code, ttft s, tpot s, e2e s, good)
        self._recent: deque[tuple[int, int, float, float, float, bool]] = deque(maxlen=MAX_RECENT)
        self._gaps: deque[tuple[int, float]] = deque(maxlen=MAX_RECENT)
        self._emitted: deque[tuple[int, int]] = deque(maxlen=MAX_RECENT)
        self._monitor: Any = None

    def fold(self, rm: Any) -> None:
        """Take in what ``rm`` (a request monitor) appended since the last fold."""
        if rm is not self._monitor:  # a new monitor (meshprof.reset()): its rows from the start
            self._monitor = rm
            self._requests_tail, self._tokens_tail = RowTail(), RowTail()
        toks = rows_since(rm.token_rows, self._tokens_tail, TOKEN_DTYPE)
        reqs = rows_since(rm.finished_rows, self._requests_tail, REQUEST_DTYPE)
        self._fold_tokens(toks)
        self._fold_requests(reqs)

    def _fold_tokens(self, toks: np.ndarray) -> None:
        last, max_gap = self._last, self._max_gap
        gaps = []
        for rid, t, n in zip(
            toks["id"].tolist(), toks["t_ns"].tolist(), toks["n"].tolist(), strict=True
        ):
            prev = last.get(rid)
            if prev is not None:
                g = t - prev
                gaps.append(g)
                self._gaps.append((t, g / 1e9))
                if g > max_gap.get(rid, 0):
                    max_gap[rid] = g
            elif len(last) >= MAX_TRACKED:
                oldest = next(iter(last))
                del last[oldest]
                max_gap.pop(oldest, None)
            last[rid] = t
            self._emitted.append((t, n))
        _observe(self.histograms["itl"], np.asarray(gaps, dtype=np.float64) / 1e9)

    def _fold_requests(self, reqs: np.ndarray) -> None:
        if not len(reqs):
            return
        r = reqs[reqs["reason"] != _UNFINISHED]
        ok = np.isin(r["reason"], _SUCCESS)

        def iv(a: str, b: str) -> np.ndarray:
            x, y = r[a].astype(np.int64), r[b].astype(np.int64)
            out = (y - x).astype(np.float64) / 1e9
            out[(x < 0) | (y < 0)] = np.nan
            return out

        ttft, e2e = iv("arrival_ns", "first_token_ns"), iv("arrival_ns", "finished_ns")
        n = r["output_tokens"].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(n >= 2, (e2e - ttft) / (n - 1), np.nan)
        figures = {
            "ttft": ttft,
            "tpot": tpot,
            "e2e": e2e,
            "queue": iv("queued_ns", "scheduled_ns"),
            "prefill": iv("scheduled_ns", "first_token_ns"),
            "decode": iv("first_token_ns", "last_token_ns"),
            "inference": iv("scheduled_ns", "last_token_ns"),
            "prompt_tokens": r["prompt_tokens"].astype(np.float64),
            "output_tokens": n,
        }
        for name, values in figures.items():
            _observe(self.histograms[name], values[ok])
        good = ok.copy()
        max_gap = np.asarray(
            [self._max_gap.get(int(i), 0) for i in r["id"].tolist()], dtype=np.float64
        )
        for rid in r["id"].tolist():
            self._last.pop(int(rid), None)
            self._max_gap.pop(int(rid), None)
        if self.slo is not None:
            limits = {"ttft": ttft, "tpot": np.nan_to_num(tpot, nan=0.0),
                      "itl": max_gap / 1e9, "e2e": e2e}  # fmt: skip
            for name in SLO_NAMES:
                bound = getattr(self.slo, f"{name}_s")
                if bound is not None:
                    v = limits[name]
                    good &= np.isfinite(v) & (v <= bound)
            self.good += int(good.sum())
        for i in range(len(r)):
            self._recent.append(
                (int(r["finished_ns"][i]), int(r["reason"][i]), float(ttft[i]), float(tpot[i]),
                 float(e2e[i]), bool(good[i]))
            )  # fmt: skip

    def window(self, now_ns: int) -> WindowFigures:
        """The figures over the last :attr:`window_s` seconds before ``now_ns``."""
        lo = now_ns - int(self.window_s * 1e9)
        for dq in (self._recent, self._gaps, self._emitted):  # older than the window: gone
            while dq and dq[0][0] < lo:
                dq.popleft()
        rec = [x for x in self._recent if x[0] >= lo]
        gaps = [g for t, g in self._gaps if t >= lo]
        emitted = [(t, n) for t, n in self._emitted if t >= lo]
        oldest = min([x[0] for x in rec[:1]] + [t for t, _ in emitted[:1]] or [now_ns])
        span_s = max((now_ns - oldest) / 1e9, 1e-9)
        ok = [x for x in rec if x[1] in _SUCCESS]

        def pct(values: list[float], q: float) -> float:
            v = [x for x in values if x == x]
            return float(np.percentile(v, q)) if v else float("nan")

        w = WindowFigures(window_s=span_s if rec or emitted else 0.0, requests=len(rec))
        for name, k in (("ttft", 2), ("tpot", 3), ("e2e", 4)):
            vals = [x[k] for x in ok]
            setattr(w, f"{name}_p50_s", pct(vals, 50))
            setattr(w, f"{name}_p99_s", pct(vals, 99))
        w.itl_p50_s, w.itl_p99_s = pct(gaps, 50), pct(gaps, 99)
        if rec or emitted:
            w.requests_per_s = len(ok) / span_s
            w.output_tokens_per_s = sum(n for _, n in emitted) / span_s
        w.error_rate = sum(1 for x in rec if x[1] == _ERROR) / len(rec) if rec else 0.0
        if self.slo is not None:
            good = sum(1 for x in ok if x[5])
            w.goodput_per_s = good / span_s if rec else 0.0
            w.slo_attainment = good / len(ok) if ok else float("nan")
        return w

    def build(self, rm: Any, now_ns: int, monitor: Any = None, counters: Any = None) -> ServingLive:
        """The live figures now (after :meth:`fold`)."""
        live = ServingLive(
            requests_running=int(rm.running),
            requests_waiting=int(rm.waiting),
            requests_finished={
                k: int(v) for k, v in rm.by_reason.items() if k in FINISH_REASONS[:4]
            },
            prompt_tokens=int(rm.prompt_tokens),
            output_tokens=int(rm.output_tokens),
            histograms=list(self.histograms.values()),
            window=self.window(now_ns),
            slo=self.slo,
            good_requests=self.good,
        )
        decode_figures(live, monitor, counters)
        return live


def decode_figures(live: ServingLive, monitor: Any, counters: Any) -> None:
    """The recent decode steps' median duration and compute on this rank (into ``live``)."""
    spans = getattr(monitor, "span_rows", None)
    names = getattr(monitor, "span_names", None)
    if not spans or not names or "decode" not in names:
        return
    code = names.index("decode")
    rows: list[tuple[Any, ...]] = []
    for _ in range(3):  # the serving thread may append while we read: retry
        try:
            for i, row in enumerate(reversed(spans)):
                if i >= _DECODE_SPANS or len(rows) >= 32:
                    break
                if row[0] == 0 and row[2] == 0 and row[3] == code:
                    rows.append(row)
            break
        except RuntimeError:
            rows = []
    if not rows:
        return
    dur, compute = [], []
    for s in rows:
        lo, d = int(s[5]), int(s[6])
        comm = counters.step_comm(int(s[4]), lo, lo + d)[0] if counters is not None else 0
        dur.append(d)
        compute.append(d - comm)
    live.decode_steps = len(rows)
    live.decode_step_s = statistics.median(dur) / 1e9
    live.decode_compute_s = statistics.median(compute) / 1e9


__all__ = ["MAX_RECENT", "MAX_TRACKED", "WINDOW_S", "LiveServing", "decode_figures"]
