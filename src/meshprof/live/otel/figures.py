"""What the exporter sends as metrics, read at one instant: :class:`ExportSnapshot`.

One typed structure holds every figure of one export: each rank's live record with what is
derived across ranks (the straggler score, the wait, the ledger with the straggler wait carved
out), the alerts raised so far, and the serving ranks' figures (the GenAI conventions'
histograms: :func:`serving_figures`, :mod:`meshprof.live.otel.genai_buckets`).
:mod:`meshprof.live.otel.metric_points` turns it into OTLP metrics, nothing else does.

The training figures are computed exactly as ``/metrics`` computes them
(:class:`~meshprof.live.metrics.LiveCollector`: the same records, the same node filter, the same
functions), so the two endpoints agree.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from meshprof.analyze.live.snapshot import carvable_exposed_ns, straggler_scores, wait_estimates
from meshprof.live.metrics import LiveCollector
from meshprof.live.otel import instruments as I
from meshprof.live.otel.genai_buckets import OPERATION, PROVIDER, rebucket
from meshprof.records.live import Alert, RankLive
from meshprof.records.serving import Histogram


@dataclass(frozen=True, slots=True)
class RankFigures:
    """One rank's figures at one instant."""

    record: RankLive
    """The rank's latest live record (its figures and its clock: ``updated_ns``,
    ``started_ns``)."""
    up: bool
    """Running and fresh (``meshprof.rank.up``)."""
    straggler_score: float | None
    """Its compute over its peers' median (None: alone in its stage, or no step yet)."""
    wait_ns: int | None
    """Its estimated wait per step for the slowest peer (None: none to wait for)."""
    ledger_ns: dict[str, int]
    """Its wall time by cause since it started recording, the straggler wait carved out
    (cause → ns, summing to ``record.ledger_wall_ns``); empty before its first step."""


@dataclass(frozen=True, slots=True)
class HistogramFigure:
    """A cumulative explicit-bucket histogram."""

    bounds: tuple[float, ...]
    """Bucket upper bounds (+Inf implied)."""
    counts: tuple[int, ...]
    """Per bucket (not cumulative), ``len(bounds) + 1`` of them."""
    sum: float
    """Sum of the values recorded, in the bounds' unit."""

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class ServingFigures:
    """A serving rank's GenAI figures since it started (the conventions' three histograms,
    seconds, with the conventions' bucket bounds:
    :data:`~meshprof.live.otel.instruments.GENAI_SERVER`)."""

    rank: int
    """Global rank that served."""
    operation: str
    """``gen_ai.operation.name`` (``text_completion``, ``chat``)."""
    provider: str
    """``gen_ai.provider.name`` (the serving framework)."""
    model: str
    """``gen_ai.request.model``."""
    started_ns: int
    """When the histograms started (their cumulative start)."""
    updated_ns: int
    """When they were read."""
    time_to_first_token: HistogramFigure
    """Successful requests' arrival → first token."""
    time_per_output_token: HistogramFigure
    """Successful requests' (E2E − TTFT) / (output tokens − 1)."""
    request_duration: dict[str, HistogramFigure]
    """Every request's arrival → last token, by ``error.type`` ("" for the successful ones)."""


@dataclass(frozen=True, slots=True)
class ExportSnapshot:
    """Every figure of one metrics export."""

    taken_ns: int
    """When it was read (wall clock)."""
    ranks: tuple[RankFigures, ...]
    """The ranks this exporter sends, by rank."""
    alerts: dict[tuple[str, str], int]
    """Alerts raised since ``alerts_since_ns``, by (kind, severity)."""
    alerts_since_ns: int
    """When the exporter started counting alerts."""
    serving: tuple[ServingFigures, ...] = ()
    """Serving ranks' GenAI figures (empty for a training job)."""


def genai_histogram(h: Histogram | None, inst: I.Instrument) -> HistogramFigure:
    """A live histogram under ``inst``'s bounds (empty when the record has none)."""
    if h is None:
        return HistogramFigure(inst.buckets, (0,) * (len(inst.buckets) + 1), 0.0)
    return HistogramFigure(inst.buckets, rebucket(h.bounds, h.buckets, inst.buckets), h.total)


def serving_figures(rec: RankLive) -> ServingFigures | None:
    """A serving rank's GenAI histograms since it started (None: the rank records no
    requests)."""
    sv = rec.serving
    if sv is None or not sv.serves_requests:
        return None
    return ServingFigures(
        rank=rec.rank,
        operation=OPERATION,
        provider=PROVIDER,
        model="",
        started_ns=rec.started_ns or rec.updated_ns,
        updated_ns=rec.updated_ns,
        time_to_first_token=genai_histogram(sv.histogram("ttft"), I.TIME_TO_FIRST_TOKEN),
        time_per_output_token=genai_histogram(sv.histogram("tpot"), I.TIME_PER_OUTPUT_TOKEN),
        request_duration={"": genai_histogram(sv.histogram("e2e"), I.REQUEST_DURATION)},
    )


class FigureReader:
    """Reads :class:`ExportSnapshot` s of one run directory for one node's ranks (``node_id``
    None: every rank), keeping what must be kept between reads: the straggler wait carved so
    far and the alerts counted."""

    def __init__(
        self, run_dir: str | os.PathLike[str], node_id: str | None, started_ns: int
    ) -> None:
        self.collector = LiveCollector(run_dir, node_id)
        self.started_ns = started_ns
        self._alerts: Counter[tuple[str, str]] = Counter()

    def count_alert(self, alert: Alert) -> None:
        """An alert raised (the exporter reads ``alerts.jsonl`` as it grows)."""
        self._alerts[(str(alert.kind), str(alert.severity))] += 1

    def read(self) -> ExportSnapshot:
        """The figures now."""
        recs, stale, now = self.collector.records()
        scores = straggler_scores(recs, stale)
        waits = wait_estimates(recs, stale)
        ranks = []
        for r, x in recs.items():
            ledger = self.collector.badput.update(x, waits.get(r, 0), carvable_exposed_ns(x))
            ranks.append(
                RankFigures(
                    record=x,
                    up=x.status == "running" and r not in stale,
                    straggler_score=scores.get(r),
                    wait_ns=waits.get(r),
                    ledger_ns=ledger,
                )
            )
        serving = [sv for x in recs.values() if (sv := serving_figures(x)) is not None]
        return ExportSnapshot(
            taken_ns=now,
            ranks=tuple(ranks),
            alerts=dict(self._alerts),
            alerts_since_ns=self.started_ns,
            serving=tuple(serving),
        )


__all__ = [
    "ExportSnapshot",
    "FigureReader",
    "HistogramFigure",
    "RankFigures",
    "ServingFigures",
    "genai_histogram",
    "serving_figures",
]
