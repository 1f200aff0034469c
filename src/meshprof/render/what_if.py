"""Text and HTML of the what-if attribution (:mod:`meshprof.analyze.run.what_if.what_if`): the sentences the
report leads with ("rank 37 costs every step 0.90 ms (6.0%), in forward") and the tables behind
them. Formatting only: every figure is a field of :class:`~meshprof.analyze.run.what_if.what_if.WhatIf`."""

from __future__ import annotations

import html
from collections.abc import Sequence

from meshprof.analyze.run.what_if.what_if import DimCost, GroupCost, RankCost, WhatIf
from meshprof.render.format import fmt_ns, fmt_pct

LEAD = 3
"""Ranks named in the lead sentences."""

_E = html.escape


def _interval(lo: float, hi: float) -> str:
    return f"95% interval {fmt_ns(lo)}–{fmt_ns(hi)}"


def rank_sentence(c: RankCost) -> str:
    """ "rank 37 costs every step 0.90 ms (6.0%; 95% interval 0.85 ms–0.95 ms), in forward"."""
    where = f", in {c.phase}" if c.phase else ""
    return (
        f"rank {c.rank} costs every step {fmt_ns(c.step_saving_ns)} "
        f"({fmt_pct(c.share_of_step)}; {_interval(c.ci_low_ns, c.ci_high_ns)}){where}"
    )


def what_if_lines(w: WhatIf | None, lead: int = LEAD) -> list[str]:
    """The lead sentences: the costliest ranks whose cost stands above the run's noise
    (:attr:`WhatIf.notable`), then where their cost is paid (dimensions and the costliest
    group); one line saying so when no rank costs measurably more."""
    if w is None:
        return []
    if w.note:
        return [f"what-if: {w.note}"]
    if w.doubt:
        return [f"what-if: {w.doubt}", *record_lines(w)]
    out = [rank_sentence(c) for c in w.notable[:lead]]
    unmeasured = (
        f"; not measured (no peers): ranks {', '.join(map(str, w.unmeasured))}"
        if w.unmeasured
        else ""
    )
    if not out:
        return [
            f"what-if: no rank costs measurably more (none saves {fmt_pct(w.min_share, 0)} of a "
            f"step or more with a 95% interval above zero; replayed {len(w.ranks)} of "
            f"{w.ranks_total} ranks over {len(w.steps)} steps{unmeasured})",
            *record_lines(w),
        ]
    dims = [d for d in w.dims if w.notable_cost(d)]
    if dims:
        out.append(
            "  paid at the collectives of: "
            + ", ".join(
                f"{d.dim} {fmt_ns(d.step_saving_ns)} ({fmt_pct(d.share_of_step)})" for d in dims
            )
        )
    if w.groups and w.notable_cost(w.groups[0]):
        g = w.groups[0]
        out.append(
            f"  costliest group: {g.desc} ({g.group}, {g.dim}) "
            f"{fmt_ns(g.step_saving_ns)} ({fmt_pct(g.share_of_step)}) every step"
        )
    if unmeasured:
        out.append(f"  {unmeasured[2:]}")
    return out + record_lines(w)


def record_lines(w: WhatIf) -> list[str]:
    """What the record contradicted and how it was repaired (nothing when it did not)."""
    r = w.record
    if not (r.capped or r.retimed or r.unrepaired or r.undecided) and not w.contradicted_ns:
        return []
    parts = []
    if r.capped:
        parts.append(f"{r.capped} blocking completions seen after the rank's next issue, capped")
    if r.retimed:
        parts.append(f"{r.retimed} seen late, set to their group's transfer")
    if r.unrepaired:
        parts.append(f"{r.unrepaired} seen late and left as recorded")
    if r.undecided:
        parts.append(f"{r.undecided} without flags taken as waited for")
    if w.contradicted_ns:
        parts.append(f"issues before waited-for completions: {fmt_ns(w.contradicted_ns)}/step")
    return [f"  record repaired ({r.members} events): " + "; ".join(parts)]


def what_if_html(w: WhatIf | None) -> str:
    """The lead sentences and the per-rank, per-dimension and per-group tables."""
    if w is None:
        return '<p class="muted">Not computed.</p>'
    lines = what_if_lines(w)
    named = 0 if w.note or w.doubt else len(w.notable[:LEAD])  # rank sentences lead
    head = (
        "<ul>"
        + "".join(f'<li class="warn">{_E(x.strip())}</li>' for x in lines[:named])
        + "".join(f"<li>{_E(x.strip())}</li>" for x in lines[named:])
        + "</ul>"
    )
    if w.note or not w.ranks:
        return head

    def ci(lo: float, hi: float) -> str:
        return f"<td>{fmt_ns(lo)}–{fmt_ns(hi)}</td>"

    def table(rows: str, what: str, measured: bool, head: str) -> str:
        """A table, or one sentence when none of its rows measured anything."""
        if not measured:
            return (
                f'<p class="muted">{what}: every step saving and its 95% interval are 0 ns '
                "(nothing measurable).</p>"
            )
        return f"{head}<tbody>{rows}</tbody></table>"

    ranks = "".join(
        f"<tr><td>{c.rank}</td><td>{fmt_ns(c.step_saving_ns)}</td>{ci(c.ci_low_ns, c.ci_high_ns)}"
        f"<td>{fmt_pct(c.share_of_step)}</td><td>{_E(c.phase or '-')}</td>"
        f"<td>{fmt_ns(c.excess_ns)}</td><td>{c.peers}</td></tr>"
        for c in w.ranks
    )
    dims = "".join(
        f"<tr><td>{_E(d.dim)}</td><td>{fmt_ns(d.step_saving_ns)}</td>{ci(d.ci_low_ns, d.ci_high_ns)}"
        f"<td>{fmt_pct(d.share_of_step)}</td><td>{fmt_ns(d.excess_ns)}</td></tr>"
        for d in w.dims
    )
    groups = "".join(
        f"<tr><td>{_E(g.desc)} ({_E(g.group)})</td><td>{_E(g.dim)}</td>"
        f"<td>{fmt_ns(g.step_saving_ns)}</td>{ci(g.ci_low_ns, g.ci_high_ns)}"
        f"<td>{fmt_pct(g.share_of_step)}</td><td>{fmt_ns(g.excess_ns)}</td></tr>"
        for g in w.groups
    )

    def measured(costs: Sequence[RankCost | DimCost | GroupCost]) -> bool:
        return any(c.step_saving_ns > 0 or c.ci_high_ns > 0 for c in costs)

    if not (measured(w.ranks) or measured(w.dims) or measured(w.groups)):
        return head + (
            f'<p class="muted">Replayed {len(w.ranks)} of {w.ranks_total} ranks over '
            f"{len(w.steps)} steps (median step {fmt_ns(w.step_ns)}): every rank's, dimension's "
            "and group's step saving and 95% interval are 0 ns (nothing measurable).</p>"
        )
    return (
        head + f'<p class="muted">Replayed {len(w.ranks)} of {w.ranks_total} ranks (largest excess '
        f"compute first) over {len(w.steps)} steps; median step {fmt_ns(w.step_ns)}.</p>"
        + table(
            ranks,
            "Ranks",
            measured(w.ranks),
            '<table id="what-if-ranks"><thead><tr><th>rank</th><th>step saving</th>'
            "<th>95% interval</th><th>share of step</th><th>phase</th><th>excess compute</th>"
            "<th>peers</th></tr></thead>",
        )
        + table(
            dims,
            "Dimensions",
            measured(w.dims),
            '<table id="what-if-dims"><thead><tr><th>dimension</th><th>step saving</th>'
            "<th>95% interval</th><th>share of step</th><th>excess compute</th></tr></thead>",
        )
        + table(
            groups,
            "Groups",
            measured(w.groups),
            '<table id="what-if-groups"><thead><tr><th>group</th><th>dim</th>'
            "<th>step saving</th><th>95% interval</th><th>share of step</th>"
            "<th>excess compute</th></tr></thead>",
        )
    )
