"""The building blocks of meshprof's HTML pages (the run report, the run comparison): one
self-contained document with inline CSS and a few lines of inline JS, sortable tables whose
"show all" rows travel as compact JSON, and canvas heatmaps whose cells travel as one byte each —
so a report of thousands of ranks stays a few MB and opens at once, offline.

Every string from a run goes through :func:`html.escape` before it gets here or here.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from typing import Any

from meshprof.render.format import sort_value

PAGE_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;padding:16px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th{background:#f4f4f4;cursor:pointer;user-select:none}td:first-child,th:first-child{text-align:left}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:140px}
.card b{display:block;font-size:18px}.warn{color:#b00020}.ok{color:#1b5e20}.muted{color:#777;font-size:12px}
.finding{border-left:4px solid #e0a000;padding:4px 10px;margin:6px 0;background:#fffaf0}
.finding.warning,.finding.high,.finding.critical{border-color:#b00020;background:#fff5f5}
code{background:#f4f4f4;padding:0 3px}svg text{font-size:11px;font-family:inherit}
button.show-all{margin:2px 0 10px;font-size:12px}canvas.heatmap{image-rendering:pixelated;border:1px solid #eee}
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;font-size:12px;padding:2px 6px;border-radius:3px;display:none}
"""
"""The pages' inline style sheet (the run report, the run comparison)."""

SORT_JS = """
(function(){
  document.querySelectorAll('table.sortable').forEach(function(t){
    t.querySelectorAll('th').forEach(function(th, col){
      th.addEventListener('click', function(){
        var body = t.tBodies[0]; var rows = Array.prototype.slice.call(body.rows);
        var asc = th.getAttribute('data-asc') !== '1'; th.setAttribute('data-asc', asc ? '1' : '0');
        rows.sort(function(a, b){
          var x = a.cells[col].getAttribute('data-v') || a.cells[col].textContent;
          var y = b.cells[col].getAttribute('data-v') || b.cells[col].textContent;
          var nx = parseFloat(x), ny = parseFloat(y);
          var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
          return asc ? c : -c;
        });
        rows.forEach(function(r){ body.appendChild(r); });
      });
    });
  });
  document.querySelectorAll('button.show-all').forEach(function(b){
    b.addEventListener('click', function(){
      var t = document.getElementById(b.getAttribute('data-table'));
      var rows = JSON.parse(document.getElementById(b.getAttribute('data-rows')).textContent);
      var body = t.tBodies[0]; body.innerHTML = '';
      rows.forEach(function(row){
        var tr = document.createElement('tr');
        row.forEach(function(c){
          var td = document.createElement('td'); td.innerHTML = c[0];
          if (c[1] !== null) { td.setAttribute('data-v', c[1]); }
          tr.appendChild(td);
        });
        body.appendChild(tr);
      });
      b.remove();
    });
  });
  var tip = document.getElementById('tip');
  document.querySelectorAll('canvas.heatmap').forEach(function(cv){
    var rows = JSON.parse(cv.getAttribute('data-rows')), cols = JSON.parse(cv.getAttribute('data-cols'));
    var lv = atob(cv.getAttribute('data-levels')), cw = +cv.getAttribute('data-cw'), ch = +cv.getAttribute('data-ch');
    var lo = +cv.getAttribute('data-lo'), hi = +cv.getAttribute('data-hi'), unit = cv.getAttribute('data-unit');
    var g = cv.getContext('2d'), n = cols.length;
    for (var i = 0; i < rows.length; i++) { for (var j = 0; j < n; j++) {
      var v = lv.charCodeAt(i * n + j);
      g.fillStyle = v === 255 ? '#eeeeee' : 'rgb(255,' + Math.round(255 - 175 * v / 254) + ',' + Math.round(255 - 200 * v / 254) + ')';
      g.fillRect(j * cw, i * ch, Math.max(cw - (cw > 3 ? 1 : 0), 1), Math.max(ch - (ch > 3 ? 1 : 0), 1));
    } }
    cv.setAttribute('data-drawn', '1');
    cv.addEventListener('mousemove', function(e){
      var r = cv.getBoundingClientRect(), j = Math.floor((e.clientX - r.left) / cw), i = Math.floor((e.clientY - r.top) / ch);
      if (i < 0 || j < 0 || i >= rows.length || j >= n || !tip) { return; }
      var v = lv.charCodeAt(i * n + j);
      var txt = v === 255 ? 'none' : (v === 0 ? '≤ ' + lo.toPrecision(3) : '≈ ' + (lo + (hi - lo) * v / 254).toPrecision(3)) + ' ' + unit;
      tip.textContent = rows[i] + ', ' + cols[j] + ': ' + txt; tip.style.display = 'block';
      tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px';
    });
    cv.addEventListener('mouseleave', function(){ if (tip) { tip.style.display = 'none'; } });
  });
  var s = document.getElementById('js-status'); if (s) { s.textContent = 'interactive: click a column header to sort'; }
})();
"""
"""Inline script: click a header of a ``table.sortable`` to sort by that column."""

_E = html.escape


def html_table(
    headers: list[str], rows: Sequence[Sequence[tuple[str, Any]]], cls: str = "sortable"
) -> str:
    """rows: cells as (escaped text, sort value)."""
    out = [
        f'<table class="{cls}"><thead><tr>'
        + "".join(f"<th>{_E(h)}</th>" for h in headers)
        + "</tr></thead><tbody>"
    ]
    for row in rows:
        cells = []
        for text, v in row:
            dv = (
                f' data-v="{_E(sort_value(v) if isinstance(v, float | int) else str(v))}"'
                if v is not None
                else ""
            )
            cells.append(f"<td{dv}>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def html_page(title: str, subject: str, sections: Sequence[tuple[str, str]]) -> str:
    """One self-contained HTML document: ``title: subject`` as its heading (``subject`` is HTML,
    escaped by the caller), then one section per (heading, HTML body), with sortable tables."""
    body = "".join(
        f'<section id="{_E(t.lower().replace(" ", "-"))}"><h2>{_E(t)}</h2>{c}</section>'
        for t, c in sections
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>{_E(title)}</title><style>{PAGE_CSS}</style></head>'
        f'<body><h1>{_E(title)}: {subject}</h1><p class="muted" id="js-status">static</p>{body}'
        '<div id="tip"></div>'
        f"<script>{SORT_JS}</script></body></html>\n"
    )


TOP_K = 20
"""Rows a long table shows before "show all"."""


def big_table(
    table_id: str,
    headers: list[str],
    rows: Sequence[Sequence[tuple[str, Any]]],
    keep: Sequence[int] | None = None,
    top: int = TOP_K,
) -> str:
    """A sortable table of ``rows`` (cells as (escaped text, sort value)) that shows ``top``
    of them — those at the indices ``keep`` (default: the first ones) — and a "show all" button
    that builds the others from compact JSON in the page."""
    if len(rows) <= top:
        return html_table(headers, rows).replace("<table ", f'<table id="{table_id}" ', 1)
    shown_idx = list(keep if keep is not None else range(len(rows)))[:top]
    shown = [rows[i] for i in shown_idx]
    data = [
        [[text, sort_value(v) if isinstance(v, float | int) else (None if v is None else str(v))]
         for text, v in row]
        for row in rows
    ]  # fmt: skip
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return (
        html_table(headers, shown).replace("<table ", f'<table id="{table_id}" ', 1)
        + f'<script type="application/json" id="{table_id}-rows">{payload}</script>'
        + f'<button class="show-all" data-table="{table_id}" data-rows="{table_id}-rows">'
        f"show all {len(rows):,} rows</button>"
    )


def canvas_heatmap(
    canvas_id: str,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    ratios: Sequence[Sequence[float]],
    lo: float,
    hi: float,
    unit: str,
    width: int = 900,
    height: int = 600,
) -> str:
    """A heatmap drawn on a canvas: cell [i][j]'s ``ratio`` (0 white … 1 red, NaN grey) as one
    byte; the tooltip says the value, ``lo + (hi − lo) · ratio`` in ``unit``."""
    n_r, n_c = len(row_labels), len(col_labels)
    cw = max(1, min(24, width // max(n_c, 1)))
    ch = max(1, min(18, height // max(n_r, 1)))
    levels = bytearray()
    for row in ratios:
        for v in row:
            levels.append(255 if math.isnan(v) else round(min(max(v, 0.0), 1.0) * 254))
    b64 = base64.b64encode(bytes(levels)).decode("ascii")
    return (
        f'<canvas class="heatmap" id="{canvas_id}" width="{cw * n_c}" height="{ch * n_r}" '
        f'data-cw="{cw}" data-ch="{ch}" data-lo="{lo:.6g}" data-hi="{hi:.6g}" data-unit="{_E(unit)}" '
        f"data-rows='{_E(json.dumps(list(row_labels)))}' data-cols='{_E(json.dumps(list(col_labels)))}' "
        f'data-levels="{b64}" role="img" aria-label="{_E(canvas_id)}"></canvas>'
    )


__all__ = [
    "PAGE_CSS",
    "SORT_JS",
    "TOP_K",
    "big_table",
    "canvas_heatmap",
    "html_page",
    "html_table",
]
