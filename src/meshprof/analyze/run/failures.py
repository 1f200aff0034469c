"""Which ranks did not finish normally, how, and whose failure came first.

A pure function over a loaded run (:func:`find_failures`). What it reads, per rank:

- the rank's own exit record (``meta.exit``: exception, exit code, a signal it caught such as
  torchrun's SIGTERM), written by the rank writer;
- the launcher's ``rank_exit_codes`` / ``rank_signals`` (merged manifest): torchrun's codes,
  negative for a signal death (-9: SIGKILL), which a killed rank cannot write itself;
- ``meta.recovered`` for a rank read from its crash-safe files (it died without its final
  rank file): the step it was in and its last tick;
- the ranks with no data at all (``problems``), except those on a node whose run directory was
  not read (not failures of the job); consecutive ranks with no data and no exit code are one
  entry (``last``: a manifest may claim millions of ranks that left nothing).

Times are on the aligned clock (the rank's wall clock + its offset, ns).
"""

from __future__ import annotations

import dataclasses
import signal as _signal
from dataclasses import dataclass

from meshprof.analyze.run.events.clock import ClockAlignment
from meshprof.records.codec import dataclass_to_json
from meshprof.rundir import LoadedRun, RankData
from meshprof.rundir.rank_problems import ELSEWHERE, MISSING, RankSpan, missing_spans

HOWS = ("signal", "exception", "exit", "missing")
"""How a rank failed: killed by a signal; an unhandled exception; a non-zero exit code; or it
left no word on how it ended (no rank file, or only crash-safe data and no exit code)."""


@dataclass(frozen=True, slots=True)
class RankFailure:
    """One rank that did not finish normally."""

    rank: int
    """Global rank."""
    how: str
    """One of :data:`HOWS`."""
    exit_code: int | None
    """Its process exit code; negative: the signal it died of (as torchrun reports it); None
    when unknown."""
    signal: str | None
    """The signal's name ("SIGKILL", "SIGTERM") for a signal death, else None."""
    last_step: int | None
    """The step the rank was in when it ended (None when it never entered one)."""
    last_seen_ns: int | None
    """When it was last seen alive, aligned clock (ns): its exit record's time, or for a killed
    rank its last crash-safe tick (at most a tick before its death); None without data."""
    first: bool
    """True for the failure that came first (the root cause); False for the others."""
    reason: str
    """A few words: "killed by SIGKILL", "connection closed by peer", the exception's text."""
    recovered: bool = False
    """Its data was recovered from crash-safe files (it never wrote its final rank file)."""
    last: int | None = None
    """For ranks ``rank`` to ``last`` that all left nothing ("missing"): the last one (None:
    this rank alone)."""

    def to_dict(self) -> dict[str, object]:
        """The JSON object (``last`` only when set)."""
        out = dataclass_to_json(self)
        if self.last is None:
            del out["last"]
        return out


#: Phrases of the collective backends' errors when a peer has gone, shortened for people.
_PEER_GONE = (
    ("connection closed by peer", "connection closed by peer"),
    ("connection reset by peer", "connection reset by peer"),
    ("broken pipe", "connection closed by peer"),
    ("timed out", "timed out"),
    ("timeout", "timed out"),
)


def short_reason(error: str, limit: int = 100) -> str:
    """A failure's error text in a few words: the backend's "peer gone" phrases, else the
    text's first line (at most ``limit`` characters)."""
    low = error.lower()
    for needle, words in _PEER_GONE:
        if needle in low:
            return words
    line = error.strip().splitlines()[0] if error.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return _signal.Signals(-code).name
    except ValueError:
        return None


def _last_step(rd: RankData) -> int | None:
    m = rd.meta
    rec = m.recovered
    candidates: list[int] = []
    if rec is not None and rec.step is not None:
        candidates.append(int(rec.step))
    elif m.current_step is not None:
        candidates.append(int(m.current_step))
    else:
        if len(rd.events):
            candidates.append(int(rd.events["step"].max()))
        steps = rd.spans[rd.spans["kind"] == 0] if len(rd.spans) else rd.spans
        if len(steps):
            candidates.append(int(steps["step"].max()) + 1)
    best = max(candidates, default=-1)
    return best if best >= 0 else None


def _last_seen_local(rd: RankData) -> int | None:
    m = rd.meta
    rec = m.recovered
    if rec is not None:
        return max(int(rec.tick_ns or 0), int(rec.step_ns or 0)) or None
    if m.exit is not None and m.exit.t_ns:
        return int(m.exit.t_ns)
    return int(m.exported_ns) if m.exported_ns else None


def _one(run: LoadedRun, r: int, clock: ClockAlignment) -> RankFailure | None:
    """Rank r's failure, or None when it finished normally (or is still running)."""
    manifest = run.manifest
    rd = run.ranks.get(r)
    ex = rd.meta.exit if rd is not None else None
    codes = manifest.rank_exit_codes or {}
    raw_code = codes.get(str(r))
    code: int | None = int(raw_code) if isinstance(raw_code, int) else None
    if code is None and ex is not None and isinstance(ex.code, int):
        code = 128 - ex.code if ex.how == "signal" and ex.code > 128 else ex.code
    sig = (manifest.rank_signals or {}).get(str(r)) or _signal_name(code)
    recovered = rd is not None and rd.meta.recovered is not None
    if ex is not None and ex.how in ("exception", "exit") and ex.code != 0:
        how, reason = ex.how, short_reason(ex.error) or f"exit code {ex.code}"
    elif sig is not None or (ex is not None and ex.how == "signal"):
        how = "signal"
        sig = sig or (ex.error if ex is not None else None) or None
        reason = f"killed by {sig}" if sig else "killed by a signal"
    elif code is not None and code > 0:
        how, reason = "exit", f"exit code {code}"
    elif rd is None:
        if manifest.status == "running" or run.is_elsewhere(r):
            return None  # (still running, or on a node whose directory was not read)
        how, reason = "missing", run.problems.get(r, "no rank file")
    elif recovered and ex is None and manifest.status != "running":
        how, reason = "missing", "ended without its final rank file"
    else:
        return None
    seen = _last_seen_local(rd) if rd is not None else None
    return RankFailure(
        rank=r,
        how=how,
        exit_code=code,
        signal=sig if how == "signal" else None,
        last_step=_last_step(rd) if rd is not None else None,
        last_seen_ns=seen + clock.offset(r) if seen is not None else None,
        first=False,
        reason=reason,
        recovered=recovered,
    )


def _consequence(f: RankFailure) -> bool:
    """Failures that follow another's rather than cause it: torchrun's SIGTERM of the
    surviving workers, and ranks with no time to order them by."""
    return f.signal == "SIGTERM" or f.last_seen_ns is None


def find_failures(run: LoadedRun, clock: ClockAlignment) -> tuple[RankFailure, ...]:
    """One entry per rank that did not finish normally, the first failure first (``first``
    True), then the others by time. The first is the earliest by ``last_seen_ns`` among the
    failures that are not consequences (torchrun's SIGTERM, ranks without data); with only
    those, the earliest of them. Empty when every rank ended normally."""
    found = [f for r in _ranks_with_word(run) if (f := _one(run, r, clock)) is not None]
    found += _silent_spans(run, set(_ranks_with_word(run)))
    if not found:
        return ()

    def key(f: RankFailure) -> tuple[bool, int, int]:
        t = f.last_seen_ns if f.last_seen_ns is not None else 2**62
        return (_consequence(f), t, f.rank)

    found.sort(key=key)
    found[0] = dataclasses.replace(found[0], first=True)
    return tuple(found)


def _ranks_with_word(run: LoadedRun) -> list[int]:
    """The ranks something says something about: loaded, damaged, or named by the launcher's
    exit codes or signals (O(what the files hold), never O(the world size claimed))."""
    m = run.manifest
    named = {
        int(k)
        for k in [*(m.rank_exit_codes or {}), *(m.rank_signals or {})]
        if str(k).isdigit() and len(str(k)) <= 9 and int(k) < run.world_size
    }
    return sorted(set(run.ranks) | set(run.problems.each) | named)


def _silent_spans(run: LoadedRun, spoken: set[int]) -> list[RankFailure]:
    """The ranks of the world nothing says anything about, one entry per run of consecutive
    ranks (none while the job runs, none on nodes whose directories were not read): O(the ranks
    present), whatever the world size claimed."""
    if run.manifest.status == "running":
        return []
    away = [s for s in run.problems.spans if s.kind == ELSEWHERE]
    out: list[RankFailure] = []
    for span in missing_spans(run.world_size, spoken):
        for first, last in _without(span.first, span.last, away):
            out.append(
                RankFailure(
                    rank=first,
                    how="missing",
                    exit_code=None,
                    signal=None,
                    last_step=None,
                    last_seen_ns=None,
                    first=False,
                    reason=run.problems.get(first) or "no rank file"
                    if first == last
                    else RankSpan(first, last, MISSING).reason,
                    last=last if last > first else None,
                )
            )
    return out


def _without(first: int, last: int, away: list[RankSpan]) -> list[tuple[int, int]]:
    """``first..last`` less the spans ``away`` (sorted, disjoint)."""
    out = []
    start = first
    for s in away:
        if s.last < start or s.first > last:
            continue
        if s.first > start:
            out.append((start, s.first - 1))
        start = max(start, s.last + 1)
    if start <= last:
        out.append((start, last))
    return out


__all__ = ["HOWS", "RankFailure", "find_failures", "short_reason"]
