"""The slowest requests, with their timelines and what made them slow.

The slowest are the successful requests whose TTFT or E2E is at or above the 99th percentile
(at most :data:`MAX_SLOW`, largest E2E first). For each: its intervals, its prefill step and its
slowest decode steps (:data:`MAX_STEPS`) with the rank that arrived last at most of each step's
collectives, and its *cause*: the interval (queue, prefill or decode) furthest above the median
successful request's, as a multiple of it; for decode, the rank that arrived last in most of
its decode steps and the wait it caused there.
"""

from __future__ import annotations

import math

import numpy as np

from meshprof.analyze.serve.rank_breakdown import StepMatrix
from meshprof.analyze.serve.request_table import RequestTable
from meshprof.analyze.serve.step_kinds import ServingSteps
from meshprof.analyze.serve.step_members import StepMembers
from meshprof.analyze.serve.types import SlowRequest, TimelineStep
from meshprof.events import STEP_KINDS

MAX_SLOW = 5
"""Slow requests shown at most."""
MAX_STEPS = 3
"""Slowest decode steps shown per slow request."""


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms" if math.isfinite(ns) else "n/a"


def slow_requests(
    table: RequestTable,
    steps: ServingSteps,
    sm: StepMembers | None = None,
    mat: StepMatrix | None = None,
    max_slow: int = MAX_SLOW,
) -> tuple[SlowRequest, ...]:
    """The slowest requests (see the module docstring)."""
    ok = np.flatnonzero(table.ok)
    if not len(ok):
        return ()
    ttft, e2e = table.ttft_ns, table.e2e_ns
    tpot = table.tpot_ns
    figs = {
        "queue": table.queue_ns,
        "prefill": table.prefill_ns,
        "decode": table.decode_ns,
    }
    med = {k: float(np.nanmedian(v[ok])) if np.isfinite(v[ok]).any() else math.nan
           for k, v in figs.items()}  # fmt: skip
    cut_t = np.nanpercentile(ttft[ok], 99) if np.isfinite(ttft[ok]).any() else math.inf
    cut_e = np.nanpercentile(e2e[ok], 99) if np.isfinite(e2e[ok]).any() else math.inf
    chosen = [i for i in ok.tolist() if ttft[i] >= cut_t or e2e[i] >= cut_e]
    chosen.sort(key=lambda i: -np.nan_to_num(e2e[i], nan=-1.0))
    rows = table.rows
    last_of_step = _last_rank_per_step(sm, mat)
    out = []
    for i in chosen[:max_slow]:
        why = "e2e" if e2e[i] >= cut_e else "ttft"
        mine = np.flatnonzero(table.tok_req == i)
        step_idx = np.unique(steps.tok_step[mine])
        step_idx = step_idx[step_idx >= 0]
        first_step = int(steps.tok_step[mine[0]]) if len(mine) else -1
        decode = step_idx[step_idx != first_step]
        dur = steps.end_ns - steps.start_ns
        slow_dec = decode[np.argsort(-dur[decode], kind="stable")][:MAX_STEPS]
        shown = ([first_step] if first_step >= 0 else []) + sorted(slow_dec.tolist())
        tl = []
        for s in shown:
            num = int(steps.step[s])
            last, caused = last_of_step.get(num, (-1, 0.0))
            k = int(steps.kind[s])
            tl.append(
                TimelineStep(
                    step=num,
                    kind=STEP_KINDS[k] if k >= 0 else "",
                    start_ns=int(steps.start_ns[s]),
                    duration_ns=int(dur[s]),
                    last_rank=last,
                    caused_wait_ns=caused,
                )
            )
        cause = _cause(i, figs, med, decode, steps, last_of_step)
        out.append(
            SlowRequest(
                id=int(rows["id"][i]),
                why=why,
                arrival_ns=int(rows["arrival_ns"][i]),
                ttft_ns=float(ttft[i]),
                e2e_ns=float(e2e[i]),
                tpot_ns=float(tpot[i]),
                queue_ns=float(figs["queue"][i]),
                prefill_ns=float(figs["prefill"][i]),
                decode_ns=float(figs["decode"][i]),
                output_tokens=int(rows["output_tokens"][i]),
                prompt_tokens=int(rows["prompt_tokens"][i]),
                cause=cause,
                steps=tuple(tl),
                decode_steps=len(decode),
            )
        )
    return tuple(out)


def _last_rank_per_step(
    sm: StepMembers | None, mat: StepMatrix | None
) -> dict[int, tuple[int, float]]:
    """step number → (the rank that arrived last at most of its collectives, the wait it
    caused there)."""
    if sm is None or mat is None or not mat.last.size:
        return {}
    out: dict[int, tuple[int, float]] = {}
    best = np.argmax(mat.last, axis=0)
    for s, num in enumerate(sm.numbers.tolist()):
        r = int(best[s])
        if mat.last[r, s] > 0:
            out[int(num)] = (mat.ranks[r], float(np.nan_to_num(mat.caused[r, s])))
    return out


def _cause(
    i: int,
    figs: dict[str, np.ndarray],
    med: dict[str, float],
    decode: np.ndarray,
    steps: ServingSteps,
    last_of_step: dict[int, tuple[int, float]],
) -> str:
    """The interval furthest above the median request's, in words."""
    best, ratio = "", 0.0
    for k, v in figs.items():
        x, m = float(v[i]), med[k]
        if not math.isfinite(x):
            continue
        r = x / m if m > 0 else (math.inf if x > 0 else 0.0)
        if x - (m if math.isfinite(m) else 0.0) > 0 and r > ratio:
            best, ratio = k, r
    if not best:
        return "no interval above the median request's"
    x = float(figs[best][i])
    text = f"{best} {_ms(x)} ({ratio:.1f}× the median request's {_ms(med[best])})"
    if best == "queue":
        text += ": it waited for earlier requests (the server was saturated)"
    elif best == "decode" and len(decode):
        counts: dict[int, list[float]] = {}
        for s in decode.tolist():
            lr = last_of_step.get(int(steps.step[s]))
            if lr is not None:
                counts.setdefault(lr[0], []).append(lr[1])
        if counts:
            r = max(counts, key=lambda k: (len(counts[k]), sum(counts[k])))
            text += (
                f"; rank {r} arrived last in {len(counts[r])} of its {len(decode)} decode steps, "
                f"its peers waiting {_ms(sum(counts[r]))} for it"
            )
    return text


__all__ = ["MAX_SLOW", "MAX_STEPS", "slow_requests"]
