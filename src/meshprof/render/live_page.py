"""The live dashboard page of ``meshprof serve``: one self-contained HTML document (inline CSS,
inline JS that draws inline SVG; nothing fetched from the network) that polls ``/api/live``
(see :mod:`meshprof.live.server`) and redraws.

Shown: the run's state (running, ranks stale, ended), a step counter and summary cards; charts
over the kept history of step time per rank, throughput per rank (tokens/s, else steps/s),
communication share by parallel dimension (mean over ranks) and memory per rank; a per-rank
table (status, step, step time, rates, shares, memory, the oldest collective in flight);
live stragglers and alerts; a serving job's requests (running, waiting, TTFT, ITL and TPOT
p50/p99 over the recent window, tokens/s, errors, goodput) and each rank's decode compute; a
link to the full report (``/report``).

Every string from the run reaches the page as JSON data and is inserted as text (``esc``) —
never as markup.
"""

from __future__ import annotations

import html
import json

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1240px;padding:12px 16px;color:#222}
h1{font-size:20px;margin:4px 0}h2{font-size:16px;margin:18px 0 6px;border-bottom:1px solid #ddd;padding-bottom:3px}
.muted{color:#777;font-size:12px}.warn{color:#b00020}.ok{color:#1b5e20}
.banner{padding:6px 10px;border-radius:6px;margin:8px 0;background:#eef6ee}.banner.warn{background:#fff0f0}.banner.ended{background:#f0f0f8}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #ddd;border-radius:6px;padding:6px 12px;min-width:120px}
.card b{display:block;font-size:18px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:12px}
.chart{border:1px solid #eee;border-radius:6px;padding:6px}.chart h3{font-size:13px;margin:0 0 4px}
svg text{font-size:10px;font-family:inherit;fill:#555}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}tr.stale td{color:#b00020}tr.ended td{color:#777}
.legend span{display:inline-block;margin-right:10px;font-size:11px}.legend i{display:inline-block;width:10px;height:3px;margin-right:3px;vertical-align:middle}
ul{margin:4px 0;padding-left:20px;font-size:13px}li.critical{color:#b00020}
"""

_JS = r"""
(function(){
'use strict';
var POLL_MS = __POLL_MS__;
var COLORS = ['#1f77b4','#d62728','#2ca02c','#ff7f0e','#9467bd','#8c564b','#e377c2','#17becf','#7f7f7f','#bcbd22'];
var hist = {};
var since = -1;
var polls = 0;
var maxKeep = 300;
var last = null;
function $(id){ return document.getElementById(id); }
function esc(s){ return String(s).replace(/[&<>"']/g, function(c){ return {'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]; }); }
function fmtNs(ns){ if (!(ns > 0)) return '–'; if (ns < 1e3) return ns.toFixed(0) + ' ns'; if (ns < 1e6) return (ns / 1e3).toFixed(1) + ' µs'; if (ns < 1e9) return (ns / 1e6).toFixed(1) + ' ms'; return (ns / 1e9).toFixed(2) + ' s'; }
function fmtBytes(b){ if (!(b >= 0)) return '–'; var u = ['B','KiB','MiB','GiB','TiB']; var i = 0; while (b >= 1024 && i < u.length - 1){ b /= 1024; i++; } return b.toFixed(i ? 1 : 0) + ' ' + u[i]; }
function fmtPct(x){ return (x >= 0) ? (100 * x).toFixed(1) + '%' : '–'; }
function fmtNum(x){ if (!(x > 0)) return '0'; if (x >= 1e6) return (x / 1e6).toFixed(2) + 'M'; if (x >= 1e3) return (x / 1e3).toFixed(1) + 'k'; return x.toFixed(x >= 10 ? 0 : 2); }
function color(i){ return COLORS[i % COLORS.length]; }

function merge(h){
  Object.keys(h).forEach(function(r){
    var rows = hist[r] || (hist[r] = []);
    h[r].forEach(function(x){ rows.push(x); });
    if (rows.length > maxKeep) rows.splice(0, rows.length - maxKeep);
  });
}

// series: [{name, points: [[x, y], ...]}]; x: seconds before now (<= 0)
function chart(id, series, fmt){
  var el = $(id); if (!el) return;
  var W = 560, H = 170, L = 62, R = 8, T = 8, B = 20;
  var xmin = 0, ymax = 0, n = 0;
  series.forEach(function(s){ s.points.forEach(function(p){ if (p[0] < xmin) xmin = p[0]; if (p[1] > ymax) ymax = p[1]; n++; }); });
  if (xmin > -10) xmin = -10;
  if (!(ymax > 0)) ymax = 1;
  ymax *= 1.1;
  function X(x){ return L + (x - xmin) / (0 - xmin) * (W - L - R); }
  function Y(y){ return T + (1 - y / ymax) * (H - T - B); }
  var out = ['<svg xmlns="http://www.w3.org/2000/svg" width="' + W + '" height="' + H + '" viewBox="0 0 ' + W + ' ' + H + '">'];
  for (var k = 0; k <= 4; k++){
    var yv = ymax * k / 4, yy = Y(yv).toFixed(1);
    out.push('<line x1="' + L + '" x2="' + (W - R) + '" y1="' + yy + '" y2="' + yy + '" stroke="#eee"/>');
    out.push('<text x="' + (L - 4) + '" y="' + (+yy + 3) + '" text-anchor="end">' + esc(k ? fmt(yv) : '0') + '</text>');
  }
  out.push('<text x="' + L + '" y="' + (H - 5) + '">' + esc(Math.round(xmin) + ' s') + '</text>');
  out.push('<text x="' + (W - R) + '" y="' + (H - 5) + '" text-anchor="end">now</text>');
  series.forEach(function(s, i){
    if (!s.points.length) return;
    var d = s.points.map(function(p, j){ return (j ? 'L' : 'M') + X(p[0]).toFixed(1) + ' ' + Y(p[1]).toFixed(1); }).join('');
    out.push('<path d="' + d + '" fill="none" stroke="' + (s.color || color(i)) + '" stroke-width="1.5"' + (s.dash ? ' stroke-dasharray="4 3"' : '') + '/>');
    var p = s.points[s.points.length - 1];
    out.push('<circle cx="' + X(p[0]).toFixed(1) + '" cy="' + Y(p[1]).toFixed(1) + '" r="2.5" fill="' + (s.color || color(i)) + '"/>');
  });
  out.push('</svg>');
  var legend = series.slice(0, 12).map(function(s, i){ return '<span><i style="background:' + (s.color || color(i)) + '"></i>' + esc(s.name) + '</span>'; }).join('');
  if (series.length > 12) legend += '<span>… ' + (series.length - 12) + ' more</span>';
  el.innerHTML = out.join('') + '<div class="legend">' + legend + '</div>';
  el.setAttribute('data-points', String(n));
}

function rankSeries(nowNs, key){
  return Object.keys(hist).sort(function(a, b){ return a - b; }).map(function(r){
    return {name: 'rank ' + r, points: hist[r].filter(function(x){ return x[key] > 0; }).map(function(x){ return [(x.t_ns - nowNs) / 1e9, x[key]]; })};
  });
}

function dimSeries(nowNs){
  var byTick = {}, dims = {};
  Object.keys(hist).forEach(function(r){
    hist[r].forEach(function(x){
      var b = byTick[x.tick] || (byTick[x.tick] = {t: 0, n: 0, dims: {}, exposed: 0});
      b.t += x.t_ns; b.n += 1; b.exposed += x.exposed_share;
      Object.keys(x.dims).forEach(function(d){ dims[d] = 1; b.dims[d] = (b.dims[d] || 0) + x.dims[d]; });
    });
  });
  var ticks = Object.keys(byTick).map(Number).sort(function(a, b){ return a - b; });
  var out = Object.keys(dims).sort().map(function(d){
    return {name: d, points: ticks.map(function(t){ var b = byTick[t]; return [(b.t / b.n - nowNs) / 1e9, (b.dims[d] || 0) / b.n]; })};
  });
  out.push({name: 'exposed (all dims)', color: '#555', dash: true, points: ticks.map(function(t){ var b = byTick[t]; return [(b.t / b.n - nowNs) / 1e9, b.exposed / b.n]; })});
  return out;
}

function fmtS(x){ return (x === null || x === undefined) ? '–' : fmtNs(x * 1e9); }

// a serving job: the lowest rank that records requests, its recent window; every rank's decode compute
function renderServing(ranks){
  var sv = ranks.filter(function(x){ return x.serving; });
  $('serving-h').style.display = sv.length ? '' : 'none';
  if (!sv.length){ $('serving').innerHTML = ''; return; }
  var main = sv.filter(function(x){ return x.serving.serves_requests; }).sort(function(a, b){ return a.rank - b.rank; })[0];
  var out = [];
  if (main){
    var s = main.serving, w = s.window;
    var cards = [['requests running', String(s.requests_running)], ['waiting', String(s.requests_waiting)],
      ['TTFT p50 / p99', fmtS(w.ttft_p50_s) + ' / ' + fmtS(w.ttft_p99_s)], ['ITL p50 / p99', fmtS(w.itl_p50_s) + ' / ' + fmtS(w.itl_p99_s)],
      ['TPOT p50 / p99', fmtS(w.tpot_p50_s) + ' / ' + fmtS(w.tpot_p99_s)], ['output tokens/s', fmtNum(w.output_tokens_per_s)],
      ['error rate', fmtPct(w.error_rate)]];
    if (s.slo) cards.push(['goodput (SLO met)', (w.goodput_per_s === null ? '–' : w.goodput_per_s.toFixed(2) + '/s') + ' (' + fmtPct(w.slo_attainment) + ')']);
    out.push('<p class="muted">rank ' + main.rank + ', last ' + (w.window_s || 0).toFixed(0) + ' s</p><div class="cards">' +
      cards.map(function(c){ return '<div class="card">' + esc(c[0]) + '<b>' + esc(c[1]) + '</b></div>'; }).join('') + '</div>');
  }
  var dec = sv.filter(function(x){ return x.serving.decode_steps > 0; });
  if (dec.length){
    out.push('<table><thead><tr><th>rank</th><th>decode step (median)</th><th>decode compute (median)</th></tr></thead><tbody>' +
      dec.map(function(x){ return '<tr><td>' + x.rank + '</td><td>' + fmtS(x.serving.decode_step_s) + '</td><td>' + fmtS(x.serving.decode_compute_s) + '</td></tr>'; }).join('') + '</tbody></table>');
  }
  $('serving').innerHTML = out.join('');
}

function rankStatus(x){
  if (x.status !== 'running') return 'ended' + (x.exit_how ? ' (' + x.exit_how + ')' : '');
  return x.stale ? 'stale' : 'running';
}

function render(d){
  var ranks = d.ranks || [];
  var now = d.taken_ns;
  var nowTs = now;
  ranks.forEach(function(x){ if (x.updated_ns > nowTs) nowTs = x.updated_ns; });
  var steps = 0, stepNs = [], tokens = 0, sps = 0, comm = 0, exposed = 0, mem = -1, running = 0;
  ranks.forEach(function(x){
    if (x.steps_done > steps) steps = x.steps_done;
    if (x.step_ns > 0) stepNs.push(x.step_ns);
    tokens += x.tokens_per_s; if (x.steps_per_s > sps) sps = x.steps_per_s;
    comm += x.comm_share; exposed += x.exposed_share;
    if (x.memory_bytes > mem) mem = x.memory_bytes;
    if (x.status === 'running') running++;
  });
  stepNs.sort(function(a, b){ return a - b; });
  var n = ranks.length || 1;
  var banner = $('banner');
  var over = ['ok', 'failed', 'hang'].indexOf(d.run_status) >= 0;
  if (!ranks.length && over){ banner.className = 'banner ended'; banner.textContent = 'the run has ended (' + d.run_status + ') and left no live records (--live-interval 0?): see the full report'; }
  else if (!ranks.length){ banner.className = 'banner'; banner.textContent = 'waiting for the ranks\u2019 first live records…'; }
  else if (d.ended){ banner.className = 'banner ended'; banner.textContent = 'the run has ended'; }
  else if (d.stale && d.stale.length){ banner.className = 'banner warn'; banner.textContent = d.stale.length + ' rank(s) stopped publishing (stale): ' + d.stale.join(', '); }
  else { banner.className = 'banner'; banner.textContent = 'running: ' + running + ' of ' + ranks.length + ' ranks publishing'; }
  $('steps').textContent = String(steps);
  $('ranks').textContent = ranks.length + (d.world_size > 0 ? ' / ' + d.world_size : '');
  $('step-time').textContent = stepNs.length ? fmtNs(stepNs[Math.floor(stepNs.length / 2)]) : '–';
  $('rate').textContent = tokens > 0 ? fmtNum(tokens) + ' tok/s' : fmtNum(sps) + ' steps/s';
  $('comm').textContent = fmtPct(comm / n) + ' / ' + fmtPct(exposed / n);
  $('memory').textContent = fmtBytes(mem);
  $('report').innerHTML = (d.ended || over) ? '<a href="/report">full report of the finished run</a>' : '<a href="/report">report from the rank files written so far</a> <span class="muted">(complete once the run ends)</span>';

  chart('chart-step', rankSeries(nowTs, 'step_ns'), fmtNs);
  var useTokens = ranks.some(function(x){ return x.tokens_per_s > 0; });
  $('rate-title').textContent = useTokens ? 'Throughput per rank (tokens/s)' : 'Throughput per rank (steps/s)';
  chart('chart-rate', rankSeries(nowTs, useTokens ? 'tokens_per_s' : 'steps_per_s'), fmtNum);
  chart('chart-comm', dimSeries(nowTs), fmtPct);
  chart('chart-mem', rankSeries(nowTs, 'memory_bytes'), fmtBytes);

  var rows = ranks.map(function(x){
    var st = rankStatus(x);
    var inf = x.inflight ? esc(x.inflight.op + ' ' + x.inflight.dim + ' ' + fmtNs(x.inflight.age_ns)) : '–';
    var cls = x.stale ? 'stale' : (x.status !== 'running' ? 'ended' : '');
    return '<tr class="' + cls + '"><td>' + x.rank + '</td><td>' + esc(x.hostname) + '</td><td>' + esc(st) + '</td><td>' + x.steps_done +
      '</td><td>' + fmtNs(x.step_ns) + '</td><td>' + fmtNum(x.steps_per_s) + '</td><td>' + fmtNum(x.tokens_per_s) + '</td><td>' + fmtPct(x.comm_share) +
      '</td><td>' + fmtPct(x.exposed_share) + '</td><td>' + fmtBytes(x.memory_bytes) + '</td><td>' + inf + '</td><td>' + ((now - x.updated_ns) / 1e9).toFixed(1) + ' s</td></tr>';
  });
  $('rank-rows').innerHTML = rows.join('');

  renderServing(ranks);

  var sl = (d.stragglers || []).map(function(s){
    return '<li>rank ' + s.rank + ' computes ' + fmtNs(s.compute_ns) + ' per step, ' + fmtNs(s.excess_ns) + ' (' + fmtPct(s.excess_ratio) + ') more than the others\u2019 median: they wait for it</li>';
  });
  $('stragglers').innerHTML = sl.length ? '<ul>' + sl.join('') + '</ul>' : '<p class="muted">none</p>';
  var al = (d.alerts || []).slice(-20).reverse().map(function(a){
    var t = new Date(a.t_ns / 1e6).toLocaleTimeString();
    return '<li class="' + esc(a.severity) + '">' + esc(t) + ' <b>' + esc(a.kind) + '</b> ' + esc(a.message) + (a.ranks && a.ranks.length ? ' <span class="muted">ranks ' + esc(a.ranks.join(', ')) + '</span>' : '') + '</li>';
  });
  $('alerts').innerHTML = al.length ? '<ul>' + al.join('') + '</ul>' : '<p class="muted">none</p>';
  $('updated').textContent = 'poll ' + polls + ', sample ' + d.tick + ', ' + new Date().toLocaleTimeString();
  document.body.setAttribute('data-polls', String(polls));
}

function poll(){
  var xhr = new XMLHttpRequest();
  xhr.open('GET', '/api/live?since=' + since);
  xhr.onload = function(){
    var wait = POLL_MS;
    if (xhr.status === 200){
      var d = JSON.parse(xhr.responseText);
      polls++;
      maxKeep = d.history_max || maxKeep;
      if (d.tick < since) hist = {};
      merge(d.history || {});
      since = d.tick;
      last = d;
      render(d);
      if (d.ended) wait = 5 * POLL_MS;
      $('conn').textContent = '';
    } else {
      $('conn').textContent = 'server answered ' + xhr.status;
    }
    setTimeout(poll, wait);
  };
  xhr.onerror = function(){ $('conn').textContent = 'server unreachable; retrying'; setTimeout(poll, 3 * POLL_MS); };
  xhr.send();
}
poll();
})();
"""

_BODY = """
<h1>meshprof live: <code>__RUN__</code></h1>
<div id="banner" class="banner">loading…</div>
<div class="cards">
<div class="card">steps done<b id="steps">–</b></div>
<div class="card">ranks<b id="ranks">–</b></div>
<div class="card">step time (median)<b id="step-time">–</b></div>
<div class="card">throughput<b id="rate">–</b></div>
<div class="card">comm / exposed<b id="comm">–</b></div>
<div class="card">memory (max rank)<b id="memory">–</b></div>
</div>
<p id="report"></p>
<h2>Over time</h2>
<div class="charts">
<div class="chart"><h3>Step time per rank (median of the recent steps)</h3><div id="chart-step"></div></div>
<div class="chart"><h3 id="rate-title">Throughput per rank</h3><div id="chart-rate"></div></div>
<div class="chart"><h3>Communication share of step time by dimension (mean over ranks)</h3><div id="chart-comm"></div></div>
<div class="chart"><h3>Memory per rank</h3><div id="chart-mem"></div></div>
</div>
<h2 id="serving-h" style="display:none">Serving</h2><div id="serving"></div>
<h2>Ranks</h2>
<table><thead><tr><th>rank</th><th>host</th><th>status</th><th>steps</th><th>step time</th><th>steps/s</th><th>tokens/s</th>
<th>comm</th><th>exposed</th><th>memory</th><th>oldest in flight</th><th>record age</th></tr></thead><tbody id="rank-rows"></tbody></table>
<h2>Stragglers</h2><div id="stragglers"><p class="muted">none</p></div>
<h2>Alerts</h2><div id="alerts"><p class="muted">none</p></div>
<p class="muted"><span id="updated"></span> <span id="conn" class="warn"></span> · <a href="/api/live">JSON</a> · <a href="/metrics">metrics</a></p>
"""


def render_live_page(run_label: str, poll_ms: int = 1000) -> str:
    """The dashboard document for the run ``run_label`` (shown, escaped), polling every
    ``poll_ms`` milliseconds."""
    js = _JS.replace("__POLL_MS__", json.dumps(max(int(poll_ms), 100)))
    body = _BODY.replace("__RUN__", html.escape(run_label))
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>meshprof live: {html.escape(run_label)}</title><style>{_CSS}</style></head>"
        f"<body>{body}<script>{js}</script></body></html>\n"
    )


__all__ = ["render_live_page"]
