"""Alert rules over live snapshots (:class:`~meshprof.records.live.LiveSnapshot`): pure state
machines that the launcher's watcher (:mod:`meshprof.live.watch`) feeds one snapshot per look.

Rules (each one can be turned off in :class:`AlertConfig`):

* ``straggler`` — a rank is one of the snapshot's live stragglers (its recent compute time
  exceeds the other ranks' median, :func:`~meshprof.analyze.live.snapshot.find_stragglers`) by more than
  ``straggler_pct`` % for ``straggler_looks`` consecutive fresh records.
* ``step_regression`` — a rank's recent step time (median of its last ``recent_steps`` steps)
  exceeds its own baseline by more than ``step_regression_pct`` % and by more than ``noise_k`` ×
  the baseline's spread (:func:`spread`), in ``hold_looks`` consecutive fresh records spanning
  at least ``hold_s`` seconds of the rank's records (a busy machine's second of slowness is no
  regression). The
  baseline is the median duration of the rank's steps ``warmup_steps`` .. ``warmup_steps +
  baseline_steps - 1`` (read from the record's ``recent_step_ns``; when the watcher looked too
  late to see those, the oldest ``baseline_steps`` steps after the warmup that it saw).
* ``throughput_drop`` — a rank's tokens/s (steps/s when its steps carry no tokens) falls below
  its baseline by more than ``throughput_drop_pct`` % and more than ``noise_k`` × the baseline's
  spread, in ``hold_looks`` consecutive fresh records over ``hold_s`` seconds: the baseline is
  the median of the first
  ``baseline_looks`` fresh records whose whole recent window lies after the warmup. Unlike step
  time, throughput counts the time between steps (data loading, evaluation, checkpoints).
* ``memory`` — a rank's memory (CUDA allocated, else the process RSS) exceeds ``memory_pct`` % of
  its capacity.
* ``memory_growth`` — a rank's memory exceeds its own baseline (the median of its first
  ``baseline_looks`` fresh records after the warmup) by more than ``memory_growth_pct`` % and
  more than ``memory_growth_floor_bytes``, in ``hold_looks`` consecutive fresh records: a leak.
* ``inflight`` — a rank's oldest collective has been in flight longer than ``inflight_s``
  seconds (from its issue time to the record's time: :func:`inflight_age_ns`).
* ``stall`` — a rank's record is fresh (its publisher still writes) but its step has not
  advanced for more than max(``stall_factor`` × its median step time, ``stall_floor_s``): stuck in
  compute, the data loader or a deadlock that releases the GIL, with or without a collective in
  flight (the alert says which; ranks with none come first, the others usually wait for them).
  When every running rank has a collective in flight (none computes, loads data or writes a
  checkpoint, so none can end the wait: a hang), the floor is ``hang_floor_s`` instead: a hang
  is found in seconds, while evaluation or a checkpoint on one rank, the others waiting for it
  in a collective, is no stall before ``stall_floor_s``. Counted from the end of the rank's
  last completed step, so not before its first step.
* ``stale`` — a running rank stopped publishing (see :meth:`RankLive.is_stale`); and, when the
  job has ended, a rank torchrun saw die whose last record says running (:meth:`AlertRules.flush`).
* ``decode_straggler``, ``slo`` — a serving job's (conditions in
  :mod:`meshprof.analyze.live.serving_rules`).

Every alert's ``value`` and ``threshold`` are in the rule's SI unit (:data:`UNITS`: a ratio,
bytes or seconds; the message may say ms, GiB or %), and ``since_step`` is the step at which the
condition began.

An alert is raised once per episode: a (rule, rank) condition raises when it becomes true
(after ``straggler_looks`` looks for stragglers, ``hold_looks`` for step regressions,
throughput drops and memory growth) and can raise again only after it has been
false for ``clear_looks`` consecutive looks. Conditions are counted on *fresh* records only (a
rank's record whose ``updated_ns`` changed since the last look), except ``stale``, which is a
property of the look itself. The ranks that trip the same rule in the same look make one alert.

``step_regression`` and ``throughput_drop`` are job-wide symptoms (:data:`JOB_WIDE`): in a
synchronous job every rank's step slows with the slowest one, the ranks that wait for it too
(the ``straggler`` rule names the one that is slow). Ranks publish at their own moments, so a
look can see one rank's record written after the slowdown and another's written before it; such
an alert is therefore held until every other running rank has published a record after the look
that first tripped it, and then names every rank that tripped meanwhile (one alert, not one per
look with whichever ranks happened to have published).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from meshprof.analyze.live.alert_config import JOB_WIDE, RULES, UNITS, AlertConfig
from meshprof.analyze.live.serving_rules import decode_excess, serving_conditions
from meshprof.records.finding import FindingKind, Severity
from meshprof.records.live import (
    STALE_GRACE_S,
    STALE_INTERVALS,
    Alert,
    LiveSnapshot,
    LiveStraggler,
    RankLive,
)

_MAX_NAMED = 4
"""Ranks named in one alert's message (the ``ranks`` list holds them all)."""


@dataclass(slots=True)
class _Episode:
    """Hysteresis of one (rule, rank) condition."""

    on: int = 0
    off: int = 0
    active: bool = False
    since_step: int = -1
    """The rank's step at the first look of the current run of true looks."""
    since_ns: int = 0
    """The rank's record time (``updated_ns``) at that look, ns."""

    def observe(
        self, cond: bool, need_on: int, need_off: int, step: int, t_ns: int = 0, need_ns: int = 0
    ) -> bool:
        """Count one look (of a record written at ``t_ns``); True when the condition just
        became an episode (raise now): true in ``need_on`` looks in a row spanning at least
        ``need_ns``."""
        if cond:
            if self.on == 0 and not self.active:
                self.since_step, self.since_ns = step, t_ns
            self.on, self.off = self.on + 1, 0
            if not self.active and self.on >= need_on and t_ns - self.since_ns >= need_ns:
                self.active = True
                return True
        else:
            self.on, self.off = 0, self.off + 1
            if self.active and self.off >= need_off:
                self.active = False
        return False


@dataclass(slots=True)
class RankBaseline:
    """One rank's baselines (None until known)."""

    step_ns: int | None = None
    """Median duration of the baseline steps, ns."""
    step_spread_ns: float = 0.0
    """1.4826 × the median absolute deviation of the baseline steps' durations, ns."""
    rate: float | None = None
    """Median tokens/s (or steps/s, see :attr:`rate_unit`) of the baseline records."""
    rate_spread: float = 0.0
    """1.4826 × the median absolute deviation of the baseline records' rates."""
    rate_unit: str = ""
    """"tokens/s" or "steps/s"."""
    rate_samples: list[float] = field(default_factory=list)
    memory_bytes: int | None = None
    """Median memory of the baseline records, bytes."""
    memory_samples: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Trip:
    """One rank that tripped a rule in this look."""

    rank: int
    text: str
    """Its part of the message."""
    value: float
    """The measured value, in the rule's SI unit (:data:`UNITS`)."""
    threshold: float
    """The threshold it crossed, in the same unit."""
    since_step: int
    """The rank's step at which the condition began."""
    first: int = 0
    """Sort group, lower first (the stall rule puts the ranks with no collective in flight,
    the likely cause, before the ranks waiting in one)."""


@dataclass(slots=True)
class _Pending:
    """A job-wide alert held until the other ranks have published again."""

    since_ns: int
    """Time of the look that first tripped it (the snapshot's ``taken_ns``), ns."""
    trips: list[_Trip] = field(default_factory=list)


def spread(values: list[float] | list[int]) -> float:
    """1.4826 × the median absolute deviation: the standard deviation of normal noise, robust to
    a few outliers (0 for fewer than 2 values)."""
    if len(values) < 2:
        return 0.0
    m = statistics.median(values)
    return 1.4826 * statistics.median([abs(v - m) for v in values])


def rank_rate(rec: RankLive) -> tuple[float, str]:
    """The rank's throughput over its recent window and its unit: tokens/s when its steps carry
    tokens, else steps/s."""
    if rec.tokens_per_s > 0:
        return rec.tokens_per_s, "tokens/s"
    return rec.steps_per_s, "steps/s"


def inflight_age_ns(rec: RankLive, now_ns: int) -> int:
    """How long the rank's oldest collective had been in flight (0: none), from its issue time
    to the record's ``updated_ns``. The record's own age is not added: the collective may have
    completed since (a healthy job's millisecond collectives would read as seconds old); a rank
    stuck in it keeps publishing larger ages, one that stopped publishing is ``stale``.
    ``now_ns`` is kept for callers that pass the look's time."""
    del now_ns
    if rec.inflight is None:
        return 0
    return max(int(rec.inflight.age_ns), 0)


def stall_ns(rec: RankLive, now_ns: int) -> int:
    """How long the rank has been in its current step at ``now_ns`` (0 before its first
    completed step): since its last step ended, by its own clock when the record was written,
    plus the record's age."""
    if rec.last_step_end_ns <= 0:
        return 0
    return max(rec.updated_ns - rec.last_step_end_ns, 0) + max(now_ns - rec.updated_ns, 0)


def _secs(ns: float) -> str:
    return f"{ns / 1e9:.0f} s" if abs(ns) >= 10e9 else f"{ns / 1e9:.1f} s"


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.0f} ms" if abs(ns) >= 10e6 else f"{ns / 1e6:.1f} ms"


class AlertRules:
    """Evaluates every rule on successive snapshots; keeps the episodes and baselines."""

    def __init__(self, config: AlertConfig | None = None) -> None:
        self.config = config if config is not None else AlertConfig()
        self.baselines: dict[int, RankBaseline] = {}
        self._episodes: dict[tuple[str, int], _Episode] = {}
        self._seen: dict[int, int] = {}
        self._pending: dict[str, _Pending] = {}

    def evaluate(self, snap: LiveSnapshot) -> list[Alert]:
        """The alerts newly raised by this look (at most one per rule)."""
        cfg = self.config
        fresh = {
            r: x
            for r, x in snap.ranks.items()
            if x.status == "running" and r not in snap.stale and self._seen.get(r) != x.updated_ns
        }
        for r, x in snap.ranks.items():
            self._seen[r] = x.updated_ns
        for r, x in fresh.items():
            self._update_baseline(r, x)
        stragglers = {s.rank: s for s in snap.stragglers}
        running = [x for x in snap.ranks.values() if x.status == "running"]
        waiting = bool(running) and all(
            x.inflight is not None and x.rank not in snap.stale for x in running
        )  # every running rank waits in a collective: none can end the wait
        trips: dict[str, list[_Trip]] = {k: [] for k in RULES}
        decode = decode_excess(snap.ranks, snap.stale)
        for r, x in fresh.items():
            for c in serving_conditions(cfg, x, decode.get(r)):  # (serving_rules.py)
                if self._observe(c.rule, r, c.holds, x.step, c.looks) and c.holds:
                    since = self._since(c.rule, r)
                    trips[c.rule].append(_Trip(r, c.text, c.value, c.threshold, since))
            self._rule_straggler(r, x, stragglers.get(r), trips)
            self._rule_step(r, x, trips)
            self._rule_rate(r, x, trips)
            self._rule_memory(r, x, trips)
            self._rule_memory_growth(r, x, trips)
            self._rule_inflight(r, x, snap.taken_ns, trips)
            self._rule_stall(r, x, snap.taken_ns, trips, waiting)
        if cfg.stale:
            for r, x in snap.ranks.items():
                cond = r in snap.stale
                if self._observe("stale", r, cond, x.step) and cond:
                    trips["stale"].append(self._stale_trip(x, snap.taken_ns))
        for r, x in snap.ranks.items():  # an ended rank's episodes are over
            if x.status != "running":
                for rule in RULES:
                    self._episodes.pop((rule, r), None)
        for rule in JOB_WIDE:
            trips[rule] = self._gather(rule, trips[rule], snap)
        return [
            a for rule in RULES if (a := self._alert(rule, trips[rule], snap.taken_ns)) is not None
        ]

    def flush(
        self, now_ns: int, snap: LiveSnapshot | None = None, died: dict[int, str] | None = None
    ) -> list[Alert]:
        """The watcher's last word when the job ended, at ``now_ns`` (ns): the job-wide alerts
        still held (:meth:`_gather`), raised now; and a ``stale`` alert for the ranks in
        ``died`` (rank -> how, from torchrun: "killed by SIGKILL") whose last record in
        ``snap`` says running — they ended without a word (SIGKILL, the OOM killer, a segfault)
        — unless one was raised already."""
        held, self._pending = self._pending, {}
        out = [
            a
            for rule in JOB_WIDE
            if rule in held and (a := self._alert(rule, held[rule].trips, now_ns))
        ]
        if snap is not None and died and self.config.stale:
            gone = []
            for r, how in sorted(died.items()):
                x = snap.ranks.get(r)
                if x is None or x.status != "running" or self._active("stale", r):
                    continue
                t = self._stale_trip(x, now_ns)
                t.text = f"{how}, last record {_secs(now_ns - x.updated_ns)} before"
                gone.append(t)
            if (a := self._alert("stale", gone, now_ns)) is not None:
                out.append(a)
        return out

    def _gather(self, rule: str, new: list[_Trip], snap: LiveSnapshot) -> list[_Trip]:
        """A job-wide rule's trips to raise now: none while a running, non-stale rank that has
        not tripped has published nothing since the look that first tripped the rule; then
        every rank that tripped from that look on."""
        p = self._pending.get(rule)
        if p is None:
            if not new:
                return []
            p = self._pending[rule] = _Pending(snap.taken_ns)
        have = {t.rank for t in p.trips}
        p.trips += [t for t in new if t.rank not in have]
        have |= {t.rank for t in new}
        for r, x in snap.ranks.items():
            if (
                r not in have
                and x.status == "running"
                and r not in snap.stale
                and x.updated_ns <= p.since_ns
            ):
                return []  # its record may predate the slowdown: wait for its next one
        del self._pending[rule]
        return p.trips

    # -- rules -------------------------------------------------------------------------------
    def _observe(
        self,
        rule: str,
        rank: int,
        cond: bool,
        step: int,
        need_on: int = 1,
        x: RankLive | None = None,
    ) -> bool:
        """One look at a (rule, rank) condition; with the rank's record ``x``, the condition
        must also have held for ``hold_s`` seconds of its records."""
        ep = self._episodes.get((rule, rank))
        if ep is None:
            if not cond:
                return False
            ep = self._episodes[(rule, rank)] = _Episode()
        t, need = (x.updated_ns, int(self.config.hold_s * 1e9)) if x is not None else (0, 0)
        return ep.observe(cond, need_on, self.config.clear_looks, step, t, need)

    def _active(self, rule: str, rank: int) -> bool:
        ep = self._episodes.get((rule, rank))
        return ep is not None and ep.active

    def _since(self, rule: str, rank: int) -> int:
        ep = self._episodes.get((rule, rank))
        return ep.since_step if ep is not None else -1

    def _rule_straggler(
        self, r: int, x: RankLive, s: LiveStraggler | None, trips: dict[str, list[_Trip]]
    ) -> None:
        cfg = self.config
        if cfg.straggler_looks <= 0 or cfg.straggler_pct <= 0:
            return
        if s is not None and s.excess_ratio * 100 <= cfg.straggler_pct:
            s = None
        if self._observe("straggler", r, s is not None, x.step, cfg.straggler_looks) and s:
            trips["straggler"].append(
                _Trip(
                    r,
                    f"+{_ms(s.excess_ns)} compute per step (+{s.excess_ratio:.0%})",
                    s.excess_ratio,
                    cfg.straggler_pct / 100,
                    self._since("straggler", r),
                )
            )

    def _rule_step(self, r: int, x: RankLive, trips: dict[str, list[_Trip]]) -> None:
        cfg = self.config
        base = self.baselines.get(r)
        if cfg.step_regression_pct <= 0 or base is None or not base.step_ns:
            return
        recent = x.recent_step_ns[-cfg.recent_steps :]
        if not recent:
            return
        now = statistics.median(recent)
        up = now / base.step_ns - 1.0
        limit = max(cfg.step_regression_pct / 100, cfg.noise_k * base.step_spread_ns / base.step_ns)
        if self._observe("step_regression", r, up > limit, x.steps_done, cfg.hold_looks, x):
            # the condition began where the run of slow steps at the window's end began
            cut = base.step_ns * (1.0 + limit / 2)
            run = 0
            for d in reversed(x.recent_step_ns):
                if d <= cut:
                    break
                run += 1
            since = x.steps_done - run if run else self._since("step_regression", r)
            trips["step_regression"].append(
                _Trip(
                    r,
                    f"{_ms(now)} per step vs {_ms(base.step_ns)} at the start (+{up:.0%}, "
                    f"limit +{limit:.0%})",
                    up,
                    limit,
                    since,
                )
            )

    def _rule_rate(self, r: int, x: RankLive, trips: dict[str, list[_Trip]]) -> None:
        cfg = self.config
        base = self.baselines.get(r)
        if cfg.throughput_drop_pct <= 0 or base is None or not base.rate:
            return
        rate, unit = rank_rate(x)
        if unit != base.rate_unit:
            return
        drop = 1.0 - rate / base.rate
        limit = min(
            max(cfg.throughput_drop_pct / 100, cfg.noise_k * base.rate_spread / base.rate), 0.99
        )
        if self._observe("throughput_drop", r, drop > limit, x.steps_done, cfg.hold_looks, x):
            trips["throughput_drop"].append(
                _Trip(
                    r,
                    f"{rate:.3g} {unit} vs {base.rate:.3g} at the start (-{drop:.0%}, "
                    f"limit -{limit:.0%})",
                    drop,
                    limit,
                    self._since("throughput_drop", r),
                )
            )

    def _rule_memory(self, r: int, x: RankLive, trips: dict[str, list[_Trip]]) -> None:
        pct = self.config.memory_pct
        if pct <= 0 or x.memory_capacity_bytes <= 0 or x.memory_bytes < 0:
            return
        share = x.memory_bytes / x.memory_capacity_bytes
        if self._observe("memory", r, share * 100 > pct, x.step):
            trips["memory"].append(
                _Trip(
                    r,
                    f"{x.memory_bytes / 2**30:.1f} of {x.memory_capacity_bytes / 2**30:.1f} GiB "
                    f"({share:.0%})",
                    float(x.memory_bytes),
                    pct / 100 * x.memory_capacity_bytes,
                    self._since("memory", r),
                )
            )

    def _rule_memory_growth(self, r: int, x: RankLive, trips: dict[str, list[_Trip]]) -> None:
        cfg = self.config
        base = self.baselines.get(r)
        if cfg.memory_growth_pct <= 0 or base is None or not base.memory_bytes:
            return
        if x.memory_bytes < 0:
            return
        grown = x.memory_bytes - base.memory_bytes
        limit = max(cfg.memory_growth_pct / 100 * base.memory_bytes, cfg.memory_growth_floor_bytes)
        if self._observe("memory_growth", r, grown > limit, x.step, cfg.hold_looks):
            trips["memory_growth"].append(
                _Trip(
                    r,
                    f"{x.memory_bytes / 2**30:.2f} GiB vs {base.memory_bytes / 2**30:.2f} GiB "
                    f"at the start (+{grown / 2**20:.0f} MiB)",
                    float(grown),
                    float(limit),
                    self._since("memory_growth", r),
                )
            )

    def _rule_inflight(
        self, r: int, x: RankLive, now_ns: int, trips: dict[str, list[_Trip]]
    ) -> None:
        limit = self.config.inflight_s
        if limit <= 0:
            return
        age_s = inflight_age_ns(x, now_ns) / 1e9
        if self._observe("inflight", r, age_s > limit, x.step) and x.inflight is not None:
            f = x.inflight
            trips["inflight"].append(
                _Trip(
                    r,
                    f"{f.op} on {f.group} (seq {f.seq}) in flight for {age_s:.0f} s",
                    age_s,
                    limit,
                    self._since("inflight", r),
                )
            )

    def _rule_stall(
        self, r: int, x: RankLive, now_ns: int, trips: dict[str, list[_Trip]], waiting: bool
    ) -> None:
        cfg = self.config
        if cfg.stall_factor <= 0 or x.step_ns <= 0 or x.last_step_end_ns <= 0:
            return
        floor = cfg.stall_floor_s
        if waiting and cfg.hang_floor_s > 0:
            floor = min(floor, cfg.hang_floor_s)
        limit_ns = max(cfg.stall_factor * x.step_ns, floor * 1e9)
        stuck_ns = stall_ns(x, now_ns)
        cond = stuck_ns > limit_ns
        if self._observe("stall", r, cond, x.step) and cond:
            f = x.inflight
            where = (
                "no collective in flight"
                if f is None
                else f"{f.op} on {f.group} (seq {f.seq}) in flight for "
                f"{_secs(inflight_age_ns(x, now_ns))}"
            )
            trips["stall"].append(
                _Trip(
                    r,
                    f"stuck at step {x.step} for {_secs(stuck_ns)} (limit {_secs(limit_ns)}), "
                    + where,
                    stuck_ns / 1e9,
                    limit_ns / 1e9,
                    x.step,
                    first=0 if f is None else 1,
                )
            )

    @staticmethod
    def _stale_trip(x: RankLive, now_ns: int) -> _Trip:
        age = max(now_ns - x.updated_ns, 0) / 1e9
        limit = STALE_INTERVALS * max(x.interval_s, 0.0) + STALE_GRACE_S
        return _Trip(x.rank, f"last record {age:.0f} s ago", age, limit, x.step)

    # -- baselines ---------------------------------------------------------------------------
    def _update_baseline(self, r: int, x: RankLive) -> None:
        cfg = self.config
        b = self.baselines.setdefault(r, RankBaseline())
        durs = x.recent_step_ns
        first = x.steps_done - len(durs)  # step index of durs[0]
        if b.step_ns is None and x.steps_done >= cfg.warmup_steps + cfg.baseline_steps:
            lo = max(cfg.warmup_steps - first, 0)
            pick = durs[lo : lo + cfg.baseline_steps]
            if len(pick) == cfg.baseline_steps:
                b.step_ns = int(statistics.median(pick))
                b.step_spread_ns = spread(pick)
        if not durs or first < cfg.warmup_steps:
            return
        if b.rate is None:
            rate, unit = rank_rate(x)
            if rate > 0:
                if b.rate_unit and unit != b.rate_unit:
                    b.rate_samples.clear()
                b.rate_unit = unit
                b.rate_samples.append(rate)
                if len(b.rate_samples) >= cfg.baseline_looks:
                    b.rate = statistics.median(b.rate_samples)
                    b.rate_spread = spread(b.rate_samples)
        if b.memory_bytes is None and x.memory_bytes > 0:
            b.memory_samples.append(x.memory_bytes)
            if len(b.memory_samples) >= cfg.baseline_looks:
                b.memory_bytes = int(statistics.median(b.memory_samples))

    # -- the alert ---------------------------------------------------------------------------
    def _alert(self, rule: str, trips: list[_Trip], taken_ns: int) -> Alert | None:
        if not trips:
            return None
        trips = sorted(trips, key=lambda t: (t.first, -t.value, t.rank))
        worst = trips[0]
        if len(trips) == 1:
            subject, detail = f"rank {worst.rank}", worst.text
        else:
            named = ", ".join(str(r) for r in sorted(t.rank for t in trips)[:_MAX_NAMED])
            more = ", …" if len(trips) > _MAX_NAMED else ""
            subject = f"{len(trips)} ranks ({named}{more})"
            detail = f"worst rank {worst.rank}: {worst.text}"
        verb = "is a straggler" if len(trips) == 1 else "are stragglers"
        if (
            rule == "stall" and len(trips) > 1
        ):  # each rank's clause: which ones wait in a collective
            more = "; …" if len(trips) > _MAX_NAMED else ""
            detail = "; ".join(f"rank {t.rank} {t.text}" for t in trips[:_MAX_NAMED]) + more
        message = {
            "straggler": f"{subject} {verb}: {detail}",
            "step_regression": f"step time regressed on {subject}: {detail}",
            "throughput_drop": f"throughput dropped on {subject}: {detail}",
            "memory": f"memory above {self.config.memory_pct:g}% on {subject}: {detail}",
            "memory_growth": f"memory grew on {subject}: {detail}",
            "inflight": f"collective stuck on {subject}: {detail}",
            "stall": f"step stalled on {subject}: {detail}",
            "stale": f"{subject} stopped publishing live state: {detail}",
            "decode_straggler": f"{subject} slow in decode: {detail}",
            "slo": f"service levels missed on {subject}: {detail}",
        }[rule]
        known = [t.since_step for t in trips if t.since_step >= 0]
        return Alert(
            kind=FindingKind(rule),
            title=message,
            t_ns=taken_ns,
            ranks=tuple(sorted(t.rank for t in trips)),
            severity=Severity.CRITICAL if rule in ("inflight", "stale") else Severity.WARNING,
            value=worst.value,
            threshold=worst.threshold,
            unit=UNITS[rule],
            since_step=min(known) if known else -1,
        )


__all__ = [
    "AlertRules",
    "RankBaseline",
    "inflight_age_ns",
    "rank_rate",
    "spread",
    "stall_ns",
]
