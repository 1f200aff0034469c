"""The serving steps of the serving rank: which forward each token emission came from, and what
kind of forward each step was.

A token emission belongs to the step that contains it or, when it came between two steps (the
sampling after a forward), to the step that ended last before it: the latest step on the
serving rank that began at or before it. A step's kind is its name when the serving loop named
it (``prefill``, ``decode``, ``mixed``: :data:`meshprof.events.STEP_KINDS`); otherwise it is
derived from its emissions: only first tokens (prefill), no first token (decode), both
(mixed); a step that emitted nothing and has no such name has no kind (warm-up, or a forward
that is not serving) and is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.analyze.run.events.window import step_spans
from meshprof.analyze.serve.request_table import RequestTable
from meshprof.analyze.serve.types import KindSummary, LatencyStats
from meshprof.events import STEP_KINDS
from meshprof.rundir import RankData

NO_KIND = -1
"""The kind code of a step that is not a serving step."""


@dataclass(frozen=True, slots=True)
class ServingSteps:
    """The serving rank's steps (sorted by start; its clock, ns) and the emissions' steps."""

    step: np.ndarray
    """int64: the step number."""
    start_ns: np.ndarray
    """int64: when it began."""
    end_ns: np.ndarray
    """int64: when it ended."""
    kind: np.ndarray
    """int8: index into :data:`~meshprof.events.STEP_KINDS`, or :data:`NO_KIND`."""
    prompt_tokens: np.ndarray
    """int64: prompt tokens of the requests whose first token it emitted."""
    output_tokens: np.ndarray
    """int64: tokens it emitted."""
    emitted: np.ndarray
    """int64: requests it emitted a token to."""
    tok_step: np.ndarray
    """int64 per emission of the request table: the row here of its step (-1: before any)."""

    def __len__(self) -> int:
        return len(self.step)

    def kind_of(self, step: int) -> str:
        """The kind of step number ``step`` ("" when it is not a serving step)."""
        i = np.flatnonzero(self.step == step)
        if not len(i) or self.kind[i[0]] < 0:
            return ""
        return STEP_KINDS[int(self.kind[i[0]])]


def serving_steps(rd: RankData, table: RequestTable) -> ServingSteps:
    """The steps of the serving rank ``rd`` and the emissions of ``table`` placed in them."""
    st = step_spans(rd)
    st = st[np.argsort(st["start_ns"], kind="stable")]
    start = st["start_ns"].astype(np.int64)
    end = start + st["duration_ns"].astype(np.int64)
    names = rd.span_names
    n = len(st)
    tok_step = np.searchsorted(start, table.tok_t, side="right").astype(np.int64) - 1
    placed = tok_step >= 0
    first = np.zeros(len(table.tok_t), dtype=bool)
    if len(first):
        first[0] = True
        first[1:] = table.tok_req[1:] != table.tok_req[:-1]
        # an emission is a first token only when it is the request's recorded first token
        first &= table.tok_t == table.rows["first_token_ns"][table.tok_req]
    firsts = np.bincount(tok_step[placed & first], minlength=n)[:n]
    emitted = np.bincount(tok_step[placed], minlength=n)[:n]
    out = np.bincount(tok_step[placed], weights=table.tok_n[placed], minlength=n)[:n]
    prompts = table.rows["prompt_tokens"][table.tok_req].astype(np.float64)
    prompt = np.bincount(tok_step[placed & first], weights=prompts[placed & first], minlength=n)
    kind = np.full(n, NO_KIND, dtype=np.int8)
    derived = np.where((firsts > 0) & (firsts == emitted), 0, np.where(firsts == 0, 1, 2)).astype(
        np.int8
    )
    kind[emitted > 0] = derived[emitted > 0]
    for code, name in enumerate(names):
        if name in STEP_KINDS:
            kind[st["name"] == code] = STEP_KINDS.index(name)
    return ServingSteps(
        step=st["step"].astype(np.int64),
        start_ns=start,
        end_ns=end,
        kind=kind,
        prompt_tokens=prompt[:n].astype(np.int64),
        output_tokens=out.astype(np.int64),
        emitted=emitted.astype(np.int64),
        tok_step=np.where(placed, tok_step, -1),
    )


def kind_summaries(steps: ServingSteps) -> tuple[KindSummary, ...]:
    """The serving steps of each kind present."""
    out = []
    dur = (steps.end_ns - steps.start_ns).astype(np.float64)
    for code, name in enumerate(STEP_KINDS):
        sel = steps.kind == code
        if not sel.any():
            continue
        out.append(
            KindSummary(
                kind=name,
                steps=int(sel.sum()),
                step=LatencyStats.of(dur[sel]),
                prompt_tokens=int(steps.prompt_tokens[sel].sum()),
                output_tokens=int(steps.output_tokens[sel].sum()),
                batch=LatencyStats.of(steps.emitted[sel].astype(np.float64)),
            )
        )
    return tuple(out)


__all__ = ["NO_KIND", "ServingSteps", "kind_summaries", "serving_steps"]
