"""``meshprof report DIR`` end to end: JSON object, missing and damaged ranks, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from data.meshprof_synth import MS, synthetic_run
from meshprof.errors import NoUsableRankFileError
from meshprof.report.stages.rank_analyses import RANK_ANALYSES
from meshprof.report.stages.tables import BY_SIZE
from meshprof.rundir import load_run


def test_json_report_with_missing_and_damaged_ranks(tmp_path, cli):
    synthetic_run(tmp_path, 4, [0, 20 * MS, -30 * MS, 10 * MS], slow_rank=1, extra_ns=6 * MS)
    (tmp_path / "rank00003.npz").unlink()
    (tmp_path / "rank00002.npz").write_bytes(b"not a zip")
    p = cli("report", str(tmp_path), "--json", "--html", str(tmp_path / "r.html"))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert set(d) >= {
        "summary",
        "ranks",
        "stragglers",
        "collectives",
        "clock",
        "problems",
        "bottlenecks",
        "memory",
    }
    probs = {x["rank"]: x["reason"] for x in d["problems"]}
    assert set(probs) == {2, 3} and "missing" in probs[3] and "damaged" in probs[2]
    assert d["summary"]["loaded_ranks"] == [0, 1]
    assert d["summary"]["stragglers"] == [1]
    assert d["stragglers"]["named"][0]["phase"] == "forward"
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    assert d["collectives"]["incomplete"] == 6  # every all_reduce lacks ranks 2 and 3
    # the cross-rank load-imbalance rule names the straggler and its phase
    lb = [b for b in d["bottlenecks"] if b["category"] == "load_imbalance"]
    assert len(lb) == 1 and lb[0]["metrics"] == {"straggler": 1, "phase": "forward"}
    assert lb[0]["value"] > 0.10
    assert abs(d["clock"]["ranks"][1]["offset_ns"] + 20 * MS) < 200_000
    html = (tmp_path / "r.html").read_text()
    assert "rank 3 not analyzed" in html and "load imbalance &gt; 10%" in html


def test_console_summary(tmp_path, cli):
    synthetic_run(tmp_path, 2, [0, 5 * MS], slow_rank=-1)
    p = cli.process("report", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "stragglers: none" in p.stdout and "clocks aligned within" in p.stdout
    assert p.stdout.index("Verdict") < p.stdout.index("across ranks")  # the verdict first
    assert max(len(line) for line in p.stdout.splitlines()) <= 80  # a pipe: 80 columns
    p = cli("report", str(tmp_path), "--full")
    assert p.returncode == 0, p.stderr
    assert "No straggler" in p.stdout and "clock alignment" in p.stdout
    p = cli("report", str(tmp_path), "--ranks", "1,7")
    assert "not in this report: ranks 7" in p.stdout and "step time" in p.stdout
    p = cli("report", str(tmp_path), "--ranks", "one")
    assert p.returncode == 2 and "--ranks" in p.stderr


def test_bad_input_exit_2(tmp_path, cli):
    p = cli.process("report", str(tmp_path / "nope"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no such directory" in p.stderr
    p = cli("report", str(tmp_path))
    assert p.returncode == 2 and "no usable rank file" in p.stderr
    with pytest.raises(NoUsableRankFileError) as no_rank:
        load_run(tmp_path)
    assert no_rank.value.problems == {} and no_rank.value.run_dir == tmp_path
    synthetic_run(tmp_path, 2, [0, 0])
    p = cli("report", str(tmp_path), "--threshold", "-1")
    assert p.returncode == 2 and "--threshold" in p.stderr
    p = cli("report", str(tmp_path), "--html", str(tmp_path))
    assert p.returncode == 2 and "is a directory" in p.stderr


def _evicting_worker(rank: int, world: int, out: str) -> int:
    """60 all_reduces of 64 B and 30 of 4 KiB through a 16-event ring buffer, half of them
    sampled out; the rank file is written as the launcher writes it."""
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.rundir import write_rank_file
    from meshprof.rundir.writer import rank_data

    prof = meshprof.enable(meshprof.ProfilerConfig(max_events=16, sample_rate=0.5))
    for _ in range(60):
        dist.all_reduce(torch.ones(16))
    for _ in range(30):
        dist.all_reduce(torch.ones(1024))
    prof.settle(1.0)
    write_rank_file(Path(out), rank_data(prof, extra_meta={"rank": rank, "world_size": world}))
    meshprof.disable()
    return len(prof.columns()[0])


def test_report_size_table_counts_evicted_and_sampled_out_collectives(tmp_path, cli):
    """The latency columns cover the retained events (at most 16 per rank here); the issued
    column is exact for the whole run: 60 + 30 collectives per rank, 2 ranks, counted by the
    test itself."""
    from meshprof.launch.spawn import run_ranks
    from meshprof.report.analysis import analyze_run
    from meshprof.rundir import load_run

    retained = run_ranks(_evicting_worker, 2, (str(tmp_path),), timeout=90)
    assert all(n <= 16 for n in retained)
    rep = analyze_run(load_run(tmp_path))
    rows = {(x.op, x.size_bucket): x for x in rep[BY_SIZE]}
    small, big = rows[("all_reduce", 64)], rows[("all_reduce", 4096)]
    assert small.recorded == 2 * 60 and big.recorded == 2 * 30
    assert small.count + big.count <= sum(retained)
    p = cli("report", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    got = {(r["op"], r["size_bucket"]): r["recorded"] for r in json.loads(p.stdout)["by_size"]}
    assert got[("all_reduce", 64)] == 120 and got[("all_reduce", 4096)] == 60


def test_damaged_or_missing_manifest_is_reported_not_fatal(tmp_path, cli):
    """A damaged manifest.json is one warning finding (a missing one, info); every rank file is
    still analysed."""
    synthetic_run(tmp_path, 2, [0, 5 * MS], slow_rank=1, extra_ns=6 * MS)
    (tmp_path / "manifest.json").write_text('{"world_size": 2, "comm')  # cut off mid-write
    p = cli("report", tmp_path, "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["summary"]["loaded_ranks"] == [0, 1] and d["summary"]["stragglers"] == [1]
    man = [f for f in d["summary"]["findings"] if f["kind"] == "manifest"]
    assert len(man) == 1 and man[0]["severity"] == "warning"
    assert "damaged manifest" in man[0]["title"] and man[0]["evidence"]["state"] == "damaged"
    p = cli("report", tmp_path)
    assert p.returncode == 0 and p.stdout.count("damaged manifest") == 1
    (tmp_path / "manifest.json").unlink()
    d = json.loads(cli("report", tmp_path, "--json").stdout)
    man = [f for f in d["summary"]["findings"] if f["kind"] == "manifest"]
    assert [(f["severity"], f["evidence"]["state"]) for f in man] == [("info", "missing")]
    assert d["summary"]["loaded_ranks"] == [0, 1]


def test_trace_merges_kineto_traces_skips_non_traces_names_damaged_ones(tmp_path, cli):
    from gpu_traces import make_gpu_trace

    synthetic_run(tmp_path, 2, [0, 0])
    (tmp_path / "rank0.pt.trace.json").write_text(json.dumps(make_gpu_trace(0, steps=2)))
    (tmp_path / "config.json").write_text('{"lr": 0.1}')  # JSON, no trace: skipped quietly
    full = json.dumps(make_gpu_trace(1, steps=2))
    # damaged, with "traceEvents" in its name: still named (a typed error, not message text)
    (tmp_path / "traceEvents_rank1.json").write_text(full[: len(full) // 2])
    out = tmp_path / "t.json"
    p = cli("report", str(tmp_path), "--trace", str(out))
    assert p.returncode == 0, p.stderr
    meta = json.loads(out.read_text())["metadata"]
    assert meta["kineto_traces_merged"] == 1
    assert [e.split(": ")[0] for e in meta["kineto_errors"]] == [
        str(tmp_path / "traceEvents_rank1.json")
    ]


@pytest.mark.parametrize("sample", [1.0, 0.5])
def test_streamed_json_is_json_dumps_of_to_dict(sample):
    """``meshprof report --json`` writes the report section by section; the bytes are those of
    ``json.dumps(report.to_dict())`` (a run with a pipeline, a what-if and, sampled, the
    sampling section first)."""
    import io

    from meshprof.report.analysis import analyze_run

    data = Path(__file__).resolve().parent / "data" / "ddp_2rank"
    rep = analyze_run(load_run(data, sample=sample))
    buf = io.StringIO()
    rep.write_json(buf)
    assert buf.getvalue() == json.dumps(rep.to_dict(), default=str)
    keys = list(json.loads(buf.getvalue()))
    assert keys[:3] == (
        ["verdict", "sampling", "summary"] if sample < 1 else ["verdict", "summary", "ledger"]
    )
    assert rep[RANK_ANALYSES]  # the streamed list is not empty


def test_json_leaves_per_step_rows_out_above_the_limit_and_says_so(
    tmp_path, cli, monkeypatch
) -> None:
    """Above PER_STEP_JSON_RANKS ranks ``--json`` leaves each rank's per-step rows out (3/4 of
    the JSON at 16,384 ranks) and names what it left in ``omitted``; ``--full`` writes them."""
    import json

    from meshprof.report import run_report

    synthetic_run(tmp_path, 4, [0, 0, 0, 0], slow_rank=-1)
    full = json.loads(cli("report", tmp_path, "--json").stdout)
    assert "omitted" not in full and all(a["per_step"] for a in full["rank_analyses"])
    monkeypatch.setattr(run_report, "PER_STEP_JSON_RANKS", 3)
    brief = json.loads(cli("report", tmp_path, "--json").stdout)
    assert all("per_step" not in a for a in brief["rank_analyses"])
    assert brief["omitted"] == [
        "rank_analyses[].per_step: 4 ranks, more than 3; meshprof report --json --full writes "
        "them, meshprof query DIR --rank R has each rank's steps"
    ]
    # everything else as before
    for a, b in zip(full["rank_analyses"], brief["rank_analyses"], strict=True):
        assert {k: v for k, v in a.items() if k != "per_step"} == b
    assert {k: v for k, v in full.items() if k != "rank_analyses"} == {
        k: v for k, v in brief.items() if k not in ("rank_analyses", "omitted")
    }
    again = json.loads(cli("report", tmp_path, "--json", "--full").stdout)
    assert "omitted" not in again and all(a["per_step"] for a in again["rank_analyses"])


def test_no_usable_rank_file_names_three_problems_and_counts_the_rest(tmp_path) -> None:
    """At 100,000 ranks every rank's problem on the error's one line was megabytes."""
    from meshprof.errors import NoUsableRankFileError

    problems = {r: f"rank {r}: damaged" for r in range(100_000)}
    e = NoUsableRankFileError(tmp_path, problems)
    msg = str(e)
    assert msg == (
        f"{tmp_path}: no usable rank file (rank 0: damaged; rank 1: damaged; rank 2: damaged; "
        "and 99,997 more)"
    )
    assert len(e.problems) == 100_000
    assert "rank 0: damaged)" in str(NoUsableRankFileError(tmp_path, {0: "rank 0: damaged"}))
