"""The request table: one row per request of the serving rank, with the intervals between its
timestamps, and every inter-token gap.

Definitions (docs/definitions.md, Serving; all on the serving rank's clock, ns):

- TTFT = first token − arrival;
- E2E = finish − arrival;
- TPOT = (E2E − TTFT) / (output tokens − 1), for a request of at least two output tokens
  (``vllm bench serve``'s; vLLM's server histogram divides the decode time instead: the two
  differ by the time from the last token to the finish, 0 under meshprof's API);
- ITL = every gap between two consecutive token emissions of one request (``vllm bench
  serve``'s and vLLM's ``inter_token_latency``; tools that report one ITL per request report a
  mean, which is TPOT here);
- queue = scheduled − queued; prefill = first token − scheduled; decode = last token − first
  token; inference = last token − scheduled (vLLM's intervals).

An interval is NaN when one of its timestamps was never recorded. A request recorded twice (its
row at a last write while running, then finished) keeps its finished row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshprof.events import FINISH_CODES, REQUEST_DTYPE, TOKEN_DTYPE
from meshprof.rundir import LoadedRun

SUCCESS = (FINISH_CODES["stop"], FINISH_CODES["length"])
"""Finish reasons of a successful request (the latency figures are over these, as
``vllm bench serve`` counts only successful requests)."""


def _interval(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """b − a (ns, float64), NaN where either timestamp is missing (< 0)."""
    out = (b - a).astype(np.float64)
    out[(a < 0) | (b < 0)] = np.nan
    return out


@dataclass(frozen=True, slots=True)
class RequestTable:
    """The serving rank's requests as columns (one row per request, by id) and their token
    emissions (sorted by request, then time)."""

    rank: int
    """The rank whose requests these are."""
    rows: np.ndarray
    """REQUEST_DTYPE, one per request, sorted by arrival."""
    tok_req: np.ndarray
    """int64 per emission: the row of its request."""
    tok_t: np.ndarray
    """int64 per emission: when (ns, the rank's clock)."""
    tok_n: np.ndarray
    """int32 per emission: tokens emitted at once."""
    ranks_with_requests: tuple[int, ...] = ()
    """Every rank that recorded requests (tensor-parallel ``generate()`` records them on each
    rank; the report reads the lowest)."""

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def ok(self) -> np.ndarray:
        """bool per request: finished successfully (stop or length)."""
        return np.isin(self.rows["reason"], SUCCESS)

    @property
    def ttft_ns(self) -> np.ndarray:
        return _interval(self.rows["arrival_ns"], self.rows["first_token_ns"])

    @property
    def e2e_ns(self) -> np.ndarray:
        return _interval(self.rows["arrival_ns"], self.rows["finished_ns"])

    @property
    def tpot_ns(self) -> np.ndarray:
        n = self.rows["output_tokens"].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = (self.e2e_ns - self.ttft_ns) / (n - 1)
        out[n < 2] = np.nan
        return out

    @property
    def queue_ns(self) -> np.ndarray:
        return _interval(self.rows["queued_ns"], self.rows["scheduled_ns"])

    @property
    def prefill_ns(self) -> np.ndarray:
        return _interval(self.rows["scheduled_ns"], self.rows["first_token_ns"])

    @property
    def decode_ns(self) -> np.ndarray:
        return _interval(self.rows["first_token_ns"], self.rows["last_token_ns"])

    @property
    def inference_ns(self) -> np.ndarray:
        return _interval(self.rows["scheduled_ns"], self.rows["last_token_ns"])

    def gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """(gap_ns float64, row int64) of every inter-token gap: each emission after a
        request's first, minus the one before it."""
        if len(self.tok_t) < 2:
            return np.zeros(0), np.zeros(0, np.int64)
        same = self.tok_req[1:] == self.tok_req[:-1]
        gap = (self.tok_t[1:] - self.tok_t[:-1])[same].astype(np.float64)
        return gap, self.tok_req[1:][same]

    def max_gap_ns(self) -> np.ndarray:
        """float64 per request: its largest inter-token gap (NaN with fewer than two
        emissions)."""
        gap, req = self.gaps()
        out = np.full(len(self.rows), -np.inf)
        np.maximum.at(out, req, gap)
        out[~np.isfinite(out)] = np.nan
        return out


def request_table(run: LoadedRun) -> RequestTable | None:
    """The requests of the lowest rank that recorded any (None: no rank served requests)."""
    have = tuple(sorted(r for r, rd in run.ranks.items() if len(rd.requests) or len(rd.tokens)))
    if not have:
        return None
    rd = run.ranks[have[0]]
    return build_table(have[0], rd.requests, rd.tokens, have)


def build_table(
    rank: int, requests: np.ndarray, tokens: np.ndarray, ranks: tuple[int, ...] = ()
) -> RequestTable:
    """The table of one rank's REQUEST_DTYPE and TOKEN_DTYPE rows (see the module docstring)."""
    req = np.asarray(requests, REQUEST_DTYPE)
    if len(req):
        done = (req["reason"] != FINISH_CODES["unfinished"]).astype(np.int8)
        order = np.lexsort((np.arange(len(req)), done, req["id"]))
        sorted_ids = req["id"][order]
        last = np.ones(len(order), dtype=bool)
        last[:-1] = sorted_ids[1:] != sorted_ids[:-1]
        req = req[order[last]]
        req = req[np.argsort(req["arrival_ns"], kind="stable")]
    tok = np.asarray(tokens, TOKEN_DTYPE)
    ids = req["id"]
    by_id = np.argsort(ids, kind="stable")
    pos = np.searchsorted(ids[by_id], tok["id"])
    pos = np.minimum(pos, max(len(ids) - 1, 0))
    known = (ids[by_id][pos] == tok["id"]) if len(ids) else np.zeros(len(tok), dtype=bool)
    tok_req = by_id[pos][known].astype(np.int64) if len(ids) else np.zeros(0, np.int64)
    tok = tok[known]
    o = np.lexsort((tok["t_ns"], tok_req))
    return RequestTable(
        rank=rank,
        rows=np.ascontiguousarray(req),
        tok_req=tok_req[o],
        tok_t=tok["t_ns"][o].astype(np.int64),
        tok_n=tok["n"][o].astype(np.int32),
        ranks_with_requests=ranks or (rank,),
    )


__all__ = ["SUCCESS", "RequestTable", "build_table", "request_table"]
