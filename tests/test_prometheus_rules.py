"""The shipped Prometheus alerting rules (``meshprof/live/prometheus_rules.yml``): every metric
they use is one the exporter serves, and, where ``promtool`` is installed (Debian: the
``prometheus`` package), they pass ``promtool check rules`` and their unit tests
(``tests/data/prometheus/rules_test.yml``: a straggler on one node against the job's median, a
collective stuck in flight, a rank that stopped writing)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from meshprof.live.metrics import LiveCollector, metrics_text
from meshprof.records.live import RankLive
from meshprof.records.serving import ServiceLevels, ServingLive, WindowFigures
from meshprof.rundir.live import write_rank_live

pytest.importorskip("prometheus_client")

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "src/meshprof/live/prometheus_rules.yml"
RULES_TEST = ROOT / "tests/data/prometheus/rules_test.yml"


def test_the_rules_use_only_metrics_the_exporter_serves(tmp_path: Path) -> None:
    now = time.time_ns()
    write_rank_live(
        tmp_path,
        RankLive(
            rank=0, updated_ns=now, interval_s=1.0, step_ns=10**7, compute_ns=8 * 10**6,
            memory_bytes=1, memory_peak_bytes=2, memory_capacity_bytes=4, steps_done=3,
            storage="writing stopped: ENOSPC (No space left on device)",
            serving=ServingLive(
                requests_finished={"stop": 3, "length": 1}, slo=ServiceLevels(ttft_s=0.2),
                window=WindowFigures(slo_attainment=0.5), decode_steps=4, decode_compute_s=0.01,
            ),
        ),
    )  # fmt: skip
    body, _ = metrics_text(LiveCollector(tmp_path))
    served = set(re.findall(r"^(meshprof_\w+)", body.decode(), re.MULTILINE))
    used = set(re.findall(r"\bmeshprof_\w+", RULES.read_text()))
    assert used and used <= served, used - served
    assert 'meshprof_storage_writing{node="",rank="0"} 0.0' in body.decode()
    assert 'meshprof_compute_seconds{node="",rank="0"} 0.008' in body.decode()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_checks_and_unit_tests_the_rules() -> None:
    check = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        ["promtool", "test", "rules", RULES_TEST.name],
        cwd=RULES_TEST.parent,
        capture_output=True,
        text=True,
    )
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr
