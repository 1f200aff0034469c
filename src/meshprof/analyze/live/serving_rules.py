"""The serving alert rules' conditions over live snapshots (the rules' state machine is
:class:`~meshprof.analyze.live.alerts.AlertRules`, which asks these each look):

* ``decode_straggler`` — a rank's compute in its recent decode steps
  (:attr:`~meshprof.records.serving.ServingLive.decode_compute_s`) exceeds the median of the
  other fresh ranks' of its pipeline stage by more than ``decode_straggler_pct`` %, for
  ``straggler_looks`` consecutive fresh records;
* ``slo`` — a serving rank's SLO attainment over the recent window falls below
  ``slo_attainment_pct`` %, for ``hold_looks`` consecutive fresh records (only with service
  levels, ``meshprof run --slo``, and finished requests in the window).

Values and thresholds are ratios (0.25 for 25 %); the SLO rule's are the share of requests
that missed (1 − attainment) and 1 − ``slo_attainment_pct`` / 100, so that, as every rule's,
the value trips by exceeding the threshold."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from meshprof.analyze.live.alert_config import AlertConfig
from meshprof.records.live import RankLive


@dataclass(frozen=True, slots=True)
class Condition:
    """One serving rule's condition for one rank at one look."""

    rule: str
    """``decode_straggler`` or ``slo`` (SLO attainment)."""
    holds: bool
    """The condition is true at this look."""
    looks: int
    """Consecutive fresh records it must hold in before the alert."""
    text: str = ""
    """The alert's detail for this rank."""
    value: float = 0.0
    """The measured value (a ratio)."""
    threshold: float = 0.0
    """The limit it crossed (a ratio)."""


def decode_excess(
    ranks: dict[int, RankLive], stale: set[int] | list[int] | frozenset[int] = frozenset()
) -> dict[int, tuple[float, float]]:
    """rank → (its compute in recent decode steps over the median of the other fresh ranks' of
    its pipeline stage, as a ratio minus 1; that excess in seconds), for the running ranks with
    decode figures that have a peer with them too (``stale``: ranks left out)."""
    have = {
        r: x.serving.decode_compute_s
        for r, x in ranks.items()
        if x.status == "running"
        and r not in stale
        and x.serving is not None
        and x.serving.decode_steps
        and math.isfinite(x.serving.decode_compute_s)
    }
    out = {}
    for r, mine in have.items():
        stage = ranks[r].stage
        peers = [v for q, v in have.items() if q != r and ranks[q].stage == stage]
        if not peers:
            continue
        ref = statistics.median(peers)
        if ref > 0:
            out[r] = (mine / ref - 1.0, mine - ref)
    return out


def serving_conditions(
    cfg: AlertConfig, x: RankLive, excess: tuple[float, float] | None
) -> Iterator[Condition]:
    """Both serving rules' conditions for rank record ``x`` (``excess``: its entry of
    :func:`decode_excess`)."""
    if cfg.decode_straggler_pct > 0 and cfg.straggler_looks > 0:
        thr = cfg.decode_straggler_pct / 100
        ratio, secs = excess if excess is not None else (0.0, 0.0)
        yield Condition(
            "decode_straggler",
            ratio > thr,
            cfg.straggler_looks,
            f"+{secs * 1e3:.1f} ms compute per decode step (+{ratio:.0%}) over its peers",
            ratio,
            thr,
        )
    s = x.serving
    if cfg.slo_attainment_pct > 0 and s is not None and s.slo is not None:
        att = s.window.slo_attainment
        miss = 1.0 - att if math.isfinite(att) else 0.0
        thr = 1.0 - cfg.slo_attainment_pct / 100
        yield Condition(
            "slo",
            math.isfinite(att) and miss > thr,
            cfg.hold_looks,
            f"{miss:.0%} of the requests of the last {s.window.window_s:.0f} s missed "
            f"{s.slo.text()} (goodput {s.window.goodput_per_s:.2f}/s, attainment {att:.0%})",
            miss,
            thr,
        )


__all__ = ["Condition", "decode_excess", "serving_conditions"]
