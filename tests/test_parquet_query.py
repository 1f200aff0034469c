"""``meshprof export --format parquet`` and ``meshprof query`` (optional extras: skipped
without pyarrow / duckdb)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synth_run import write_run

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    info = write_run(d, 16, collectives=60, steps=3, seed=5, layout=(2, 2, 4), clock_ms=20)
    return d, info


def test_export_writes_five_tables_one_row_per_event(run_dir, tmp_path, cli):
    d, info = run_dir
    out = tmp_path / "pq"
    res = cli("export", d, out, "--format", "parquet", "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["rows"]["events"] == 16 * info["events_per_rank"]
    ev = pq.read_table(out / "events.parquet")
    assert ev.num_rows == 16 * info["events_per_rank"]
    for name in ("spans", "memory", "groups", "ranks"):
        assert (out / f"{name}.parquet").exists()
    # aligned times: rank 0's clock; the synthetic truth is known
    ranks = pq.read_table(out / "ranks.parquet").to_pydict()
    truth = info["aligned_offsets_ns"]
    err = np.abs(np.asarray(ranks["clock_offset_ns"]) - np.asarray(truth))
    assert err.max() < 20_000
    cols = ev.to_pydict()
    r = np.asarray(cols["rank"])
    a = np.asarray(cols["aligned_start_ns"]) - np.asarray(cols["start_ns"])
    assert (a == np.asarray(ranks["clock_offset_ns"])[r]).all()
    assert set(cols["dimension"]) >= {"dp", "tp"}  # (20 slots a step: no pipeline send)
    # every collective is matched: a wait on every row but send/recv
    assert sum(w is None for w in cols["wait_ns"]) == int((np.asarray(cols["peer"]) >= 0).sum())


def test_query_p99_per_dp_group_and_step(run_dir, tmp_path, cli):
    pytest.importorskip("duckdb")
    d, _ = run_dir
    sql = (
        "SELECT g.name AS dp_group, e.step, quantile_cont(e.duration_ns, 0.99) AS p99 "
        "FROM events e JOIN groups g ON e.group_name = g.name "
        "WHERE e.op = 'reduce_scatter' AND g.dimension = 'dp' GROUP BY ALL ORDER BY ALL"
    )
    res = cli("query", d, sql, "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert len(rows) == 8 * 3  # 8 dp groups (tp 2 × pp 4) × 3 steps
    assert all(r["p99"] > 0 for r in rows)
    # the same over an exported folder
    out = tmp_path / "pq"
    assert cli("export", d, out).returncode == 0
    res = cli("query", out, sql, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == rows


def test_bad_input_one_line_exit_2(run_dir, tmp_path, cli):
    pytest.importorskip("duckdb")
    d, _ = run_dir
    res = cli("query", d, "SELECT no_such_column FROM events")
    assert res.returncode == 2
    err = res.stderr.strip()
    assert err.startswith("meshprof query: error: query failed:") and "\n" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    for res in (cli("query", empty, "SELECT 1"), cli("export", empty, tmp_path / "x")):
        assert res.returncode == 2
        err_lines = res.stderr.strip().splitlines()
        assert len(err_lines) == 1 and "no usable rank file" in err_lines[0]
