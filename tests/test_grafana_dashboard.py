"""The shipped Grafana dashboard (``meshprof/live/grafana_dashboard.json``): Grafana's dashboard
shape (panels with a place on the grid and targets with a PromQL ``expr``), every metric it
uses one the exporter serves (here a scrape of synthetic records; test_live_metrics.py checks
it against a real job's scrape), and every expression parses (``promtool check rules`` on the
expressions as recording rules, where promtool is installed: CI installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from meshprof.live.metrics import LiveCollector, metrics_text
from meshprof.records.live import DimLive, OpSeries, RankLive
from meshprof.records.serving import (
    HISTOGRAMS,
    Histogram,
    ServiceLevels,
    ServingLive,
    WindowFigures,
)
from meshprof.rundir.live import write_rank_live

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "src/meshprof/live/grafana_dashboard.json"
GRAFANA_VARS = {"$__rate_interval": "1m", "$job": ".*"}
"""What Grafana puts for its variables (promtool does not know them)."""


def dashboard_exprs(serving: bool = True) -> list[str]:
    """Every target's PromQL, Grafana's variables filled in (``serving`` False: not those of the
    Serving row, whose metrics only a serving job has)."""
    out = []
    row = ""
    for p in json.loads(DASHBOARD.read_text("utf-8"))["panels"]:
        if p["type"] == "row":
            row = p["title"]
        if row == "Serving" and not serving:
            continue
        for t in p.get("targets", []):
            e = t["expr"]
            for k, v in GRAFANA_VARS.items():
                e = e.replace(k, v)
            out.append(e)
    return out


def dashboard_metrics(serving: bool = True) -> set[str]:
    return {m for e in dashboard_exprs(serving) for m in re.findall(r"\bmeshprof_\w+", e)}


def served_metrics(text: str) -> set[str]:
    """The sample names of a scrape (histograms as _bucket, _sum, _count)."""
    return set(re.findall(r"^(meshprof_\w+)", text, re.MULTILINE))


def test_dashboard_has_grafanas_shape() -> None:
    d: dict[str, Any] = json.loads(DASHBOARD.read_text("utf-8"))
    assert d["title"] and d["uid"] and isinstance(d["schemaVersion"], int)
    names = {v["name"] for v in d["templating"]["list"]}
    assert names == {"datasource", "job"}
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        g = p["gridPos"]
        assert {"x", "y", "w", "h"} <= set(g) and g["x"] >= 0 and g["x"] + g["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat") and p["title"] and p["targets"]
        for t in p["targets"]:
            assert t["refId"] and t["expr"].strip(), p["title"]
    titles = " ".join(p["title"] for p in d["panels"]).lower()
    for what in ("straggler score", "badput", "step", "exposed", "in flight", "memory",
                 "time to first token", "goodput and slo", "decode compute"):  # fmt: skip
        assert what in titles, what


def test_dashboard_uses_only_served_metrics(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    now = time.time_ns()
    for r in (0, 1):
        write_rank_live(
            tmp_path,
            RankLive(
                rank=r, updated_ns=now, interval_s=1.0, step_ns=10**7, compute_ns=(8 + r) * 10**6,
                recent_step_ns=[10**7], memory_bytes=1, memory_peak_bytes=2,
                memory_capacity_bytes=4, steps_done=3, tokens_per_s=10.0,
                dims=[DimLive("dp", 10**6, 10**6, 0.1, 0.1)], ledger_ns={"compute": 5},
                ledger_wall_ns=5, series=[OpSeries("all_reduce", "dp", 1, 10**6)],
                serving=ServingLive(
                    requests_finished={"stop": 3}, slo=ServiceLevels(ttft_s=0.2),
                    histograms=[Histogram.empty(n) for n in HISTOGRAMS],
                    window=WindowFigures(slo_attainment=0.5, goodput_per_s=1.0),
                    decode_steps=4, decode_compute_s=0.01 * (1 + r),
                ),
            ),
        )  # fmt: skip
    text = metrics_text(LiveCollector(tmp_path))[0].decode()
    used = dashboard_metrics()
    assert "meshprof_straggler_score" in used and "meshprof_badput_seconds_total" in used
    assert used <= served_metrics(text), used - served_metrics(text)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_dashboard_expressions_parse(tmp_path: Path) -> None:
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{i}", "expr": e}
                    for i, e in enumerate(dashboard_exprs())
                ],
            }
        ]
    }
    f = tmp_path / "dashboard_rules.yml"
    f.write_text(json.dumps(rules))  # JSON is YAML
    check = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
