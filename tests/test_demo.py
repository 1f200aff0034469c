"""`meshprof demo` end to end: the command a user runs, then the files it wrote."""

from __future__ import annotations

import json

import pytest

from meshprof.events import CommEvent


@pytest.mark.slow
def test_demo_trains_profiles_and_writes_its_output(tmp_path, cli):
    out = tmp_path / "demo"
    p = cli.process("demo", "-o", out, "--steps", "8", "--json", "--timeout", "200", timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    losses = doc["losses"]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5, losses  # it learns the token rule
    assert doc["config"]["parallel"]["dp"] == 2 and doc["config"]["parallel"]["pp"] == 2
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3]
    assert all(r["losses"] == losses for r in doc["ranks"])
    assert json.loads((out / "demo.json").read_text())["losses"] == losses
    # the default layout (dp=2 × pp=2) communicates over DP and PP and never over TP
    dims = {d: sum(r["dimensions"][d]["count"] for r in doc["ranks"]) for d in ("dp", "tp", "pp")}
    assert dims["dp"] > 0 and dims["pp"] > 0 and dims["tp"] == 0, dims
    # each rank's recorder export is there and its pipeline sends go to the next PP rank
    assert doc["files"] == [f"comm_rank{r:05d}.json" for r in range(4)]
    rank0 = json.loads((out / "comm_rank00000.json").read_text())
    sends = [CommEvent.from_dict(e) for e in rank0["events"] if e["op"] == "send"]
    assert sends and {e.peer for e in sends} == {1}
    # the 1F1B stage pairs issue their async sends and receives in crossed order; the what-if
    # replays them (levels by issue) and reproduces the recorded step ends exactly
    rep = json.loads(cli("report", out, "--json").stdout)
    info = rep["what_if_info"]
    assert info["note"] == "" and info["replay_error_ns"] == 0, info
    assert sorted(r["rank"] for r in rep["what_if"]) == [0, 1, 2, 3]


def test_demo_rejects_bad_layouts_with_one_line(cli):
    p = cli.process("demo", "--tp", "3", "--steps", "1", timeout=60)
    assert p.returncode == 2
    assert p.stdout == "" and p.stderr.strip().count("\n") == 0 and "tp=3" in p.stderr
