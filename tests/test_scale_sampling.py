"""Scale: the report on a consistent sample of the collectives (``meshprof report --sample``,
``--max-memory``), against the whole run and the synthetic run's known truth
(``benchmarks/synth_run.py``: clocks off by up to ±30 ms, one rank computing 30 % longer)."""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from meshprof.report.analysis import analyze_run
from meshprof.rundir import load_run
from meshprof.rundir.sampling import sampled, threshold

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synth_run import write_run

from meshprof.report.stages.matching import CLOCK, COLLECTIVES
from meshprof.report.stages.sampling_error import SAMPLING
from meshprof.report.stages.stragglers import STRAGGLERS
from meshprof.report.stages.tables import BY_SIZE, RANKS

US = 1_000
SLOW = 5


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("sampled")
    info = write_run(
        d, 16, 6000, 10, slow_rank=SLOW, seed=4, layout=(2, 4, 2), clock_ms=30, slow_phases=(1, 2)
    )
    return d, info


def test_recorder_hash_reproduced():
    """The loader keeps what the recorder's expression keeps (Python ints, no overflow)."""
    rng = np.random.default_rng(0)
    seq = np.r_[rng.integers(0, 2**40, 5000), np.arange(1000), [2**32 - 1, 2**33 + 7]]
    for name in ("0", "1", "default_pg", "mesh_tp_3"):
        crc = zlib.crc32(name.encode())
        for f in (0.01, 0.1, 0.5):
            thr = threshold(f)
            want = [(((int(s) * 2654435761) ^ crc) & 0xFFFFFFFF) < thr for s in seq.tolist()]
            got = sampled(seq, np.full(len(seq), crc, dtype=np.uint64), thr)
            assert got.tolist() == want


def test_ten_percent_sample_keeps_the_truth(synth):
    d, info = synth
    full_run = load_run(d, lean=True)
    full_events = sum(len(rd.events) for rd in full_run.ranks.values())
    full = analyze_run(full_run)
    run = load_run(d, sample=0.1)
    loaded = sum(len(rd.events) for rd in run.ranks.values())
    # what was loaded: about a tenth of the events, the file sizes known
    assert 0.07 * full_events <= loaded <= 0.13 * full_events
    assert [rd.file_events for rd in run.ranks.values()] == [
        len(rd.events) for rd in full_run.ranks.values()
    ]
    rep = analyze_run(run)
    sm = rep.get(SAMPLING)
    assert sm is not None and full.get(SAMPLING) is None
    assert sm.fraction == 0.1 and sm.events_recorded == full_events
    assert sm.events_loaded == loaded and 0 < sm.collectives < 0.13 * full[COLLECTIVES].collectives
    # every member's copy of a sampled collective was kept: all of them match completely
    assert rep[COLLECTIVES].incomplete == 0 and full[COLLECTIVES].incomplete == 0
    # the slow rank and the clock offsets, against the truth
    assert [x.rank for x in rep[STRAGGLERS].stragglers] == [SLOW]
    truth = np.asarray(info["aligned_offsets_ns"])
    got = np.asarray([rc.offset_ns for rc in rep[CLOCK].ranks])
    assert np.abs(got - truth).max() <= 20 * US
    # p50 latency of each op and size: the whole run's lies in the stated interval
    whole = {(r.op, r.size_bucket): r.p50_ns for r in full[BY_SIZE]}
    checked = 0
    for x in sm.latency:
        assert x.low_ns <= x.p50_ns <= x.high_ns
        if x.collectives >= 10:
            assert x.low_ns <= whole[(x.op, x.size_bucket)] <= x.high_ns, x
            checked += 1
    assert checked >= 2 and 0 < sm.latency_p50_rel_error < 1
    # communication share (scaled from the sample): within 3 standard errors of the whole run's
    assert sm.comm_share_error > 0
    for a, b in zip(rep[RANKS], full[RANKS], strict=True):
        assert abs(a.comm_share - b.comm_share) <= 3 * sm.comm_share_error, (a.rank, a, b)


def test_cli_sample_and_memory_budget(synth, cli, tmp_path):
    d, _ = synth
    plain = json.loads(cli("report", d, "--json").stdout)
    assert "sampling" not in plain
    p = cli("report", d, "--json", "--sample", "0.1")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)["sampling"]
    assert s["fraction"] == 0.1 and s["reason"] == "--sample 0.1"
    assert s["events_loaded"] < 0.13 * s["events_recorded"]
    assert {"collectives", "latency_p50_rel_error", "comm_share_error", "latency"} <= set(s)
    text = cli("report", d, "--sample", "0.1", "--html", tmp_path / "r.html").stdout
    assert "sampled: 10.0% of the collectives" in text
    html = (tmp_path / "r.html").read_text()
    assert 'id="sampling">sampled: 10.0% of the collectives (--sample 0.1)' in html
    # a budget the whole run does not fit in (150 MiB of base + 120 B per event estimated)
    p = cli("report", d, "--json", "--max-memory", "151M")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)["sampling"]
    assert 0 < s["fraction"] < 1 and "--max-memory" in s["reason"]
    assert "sampling" not in json.loads(cli("report", d, "--json", "--max-memory", "8G").stdout)
    for bad in (
        ("--sample", "0"),
        ("--sample", "1.5"),
        ("--sample", "x"),
        ("--max-memory", "lots"),
    ):
        p = cli("report", d, *bad)
        assert p.returncode == 2 and p.stderr.strip().count("\n") == 0, (bad, p.stderr)
