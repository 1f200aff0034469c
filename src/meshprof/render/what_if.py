"""Text and HTML of the what-if attribution (:mod:`meshprof.analyze.run.what_if`): the sentences the
report leads with ("rank 37 costs every step 0.90 ms (6.0%), in forward") and the tables behind
them. Formatting only: every figure is a field of :class:`~meshprof.analyze.run.what_if.WhatIf`."""

from __future__ import annotations

import html

from meshprof.analyze.run.what_if import RankCost, WhatIf
from meshprof.render.format import fmt_ns, fmt_pct

LEAD = 3
"""Ranks named in the lead sentences."""

_E = html.escape


def rank_sentence(c: RankCost) -> str:
    """ "rank 37 costs every step 0.90 ms (6.0%), in forward"."""
    where = f", in {c.phase}" if c.phase else ""
    return (
        f"rank {c.rank} costs every step {fmt_ns(c.step_saving_ns)} "
        f"({fmt_pct(c.share_of_step)}){where}"
    )


def what_if_lines(w: WhatIf | None, lead: int = LEAD) -> list[str]:
    """The lead sentences: the costliest ranks, then where their cost is paid (dimensions and
    the costliest group); one line saying so when no rank costs :attr:`WhatIf.min_share`."""
    if w is None:
        return []
    if w.note:
        return [f"what-if: {w.note}"]
    out = [rank_sentence(c) for c in w.notable[:lead]]
    if not out:
        return [
            f"what-if: no rank costs {fmt_pct(w.min_share, 0)} of a step or more "
            f"(replayed {len(w.ranks)} of {w.ranks_total} ranks over {len(w.steps)} steps)"
        ]
    dims = [d for d in w.dims if d.share_of_step >= w.min_share]
    if dims:
        out.append(
            "  paid at the collectives of: "
            + ", ".join(
                f"{d.dim} {fmt_ns(d.step_saving_ns)} ({fmt_pct(d.share_of_step)})" for d in dims
            )
        )
    if w.groups and w.groups[0].share_of_step >= w.min_share:
        g = w.groups[0]
        out.append(
            f"  costliest group: {g.desc} ({g.group}, {g.dim}) "
            f"{fmt_ns(g.step_saving_ns)} ({fmt_pct(g.share_of_step)}) every step"
        )
    return out


def what_if_html(w: WhatIf | None) -> str:
    """The lead sentences and the per-rank, per-dimension and per-group tables."""
    if w is None:
        return '<p class="muted">Not computed.</p>'
    lines = what_if_lines(w)
    named = 0 if w.note else len(w.notable[:LEAD])  # the rank sentences lead the lines
    head = (
        "<ul>"
        + "".join(f'<li class="warn">{_E(x.strip())}</li>' for x in lines[:named])
        + "".join(f"<li>{_E(x.strip())}</li>" for x in lines[named:])
        + "</ul>"
    )
    if w.note or not w.ranks:
        return head
    ranks = "".join(
        f"<tr><td>{c.rank}</td><td>{fmt_ns(c.step_saving_ns)}</td>"
        f"<td>{fmt_pct(c.share_of_step)}</td><td>{_E(c.phase or '-')}</td>"
        f"<td>{fmt_ns(c.excess_ns)}</td></tr>"
        for c in w.ranks
    )
    dims = "".join(
        f"<tr><td>{_E(d.dim)}</td><td>{fmt_ns(d.step_saving_ns)}</td>"
        f"<td>{fmt_pct(d.share_of_step)}</td><td>{fmt_ns(d.excess_ns)}</td></tr>"
        for d in w.dims
    )
    groups = "".join(
        f"<tr><td>{_E(g.desc)} ({_E(g.group)})</td><td>{_E(g.dim)}</td>"
        f"<td>{fmt_ns(g.step_saving_ns)}</td><td>{fmt_pct(g.share_of_step)}</td>"
        f"<td>{fmt_ns(g.excess_ns)}</td></tr>"
        for g in w.groups
    )
    return (
        head + f'<p class="muted">Replayed {len(w.ranks)} of {w.ranks_total} ranks (largest excess '
        f"compute first) over {len(w.steps)} steps; median step {fmt_ns(w.step_ns)}.</p>"
        + '<table id="what-if-ranks"><thead><tr><th>rank</th><th>step saving</th>'
        "<th>share of step</th><th>phase</th><th>excess compute</th></tr></thead>"
        f"<tbody>{ranks}</tbody></table>"
        + '<table id="what-if-dims"><thead><tr><th>dimension</th><th>step saving</th>'
        "<th>share of step</th><th>excess compute</th></tr></thead>"
        f"<tbody>{dims}</tbody></table>"
        + '<table id="what-if-groups"><thead><tr><th>group</th><th>dim</th>'
        "<th>step saving</th><th>share of step</th><th>excess compute</th></tr></thead>"
        f"<tbody>{groups}</tbody></table>"
    )
