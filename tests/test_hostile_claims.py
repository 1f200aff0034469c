"""Claims bounded by evidence (issue 39): the world size and ranks a manifest, a rank's meta, a
live record or a hang dump claims cost what the files present cost, not what they claim.

The truths: the report of the same two rank files without the claim (its peak of Python
memory, tracemalloc's, which meshprof does not compute, and its conclusions), and the ranks the
test itself left out."""

from __future__ import annotations

import json
import shutil
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from meshprof.records.members import MAX_WORLD_SIZE
from meshprof.rundir import load_run
from meshprof.rundir.rank_problems import ELSEWHERE, MISSING, RankProblems, RankSpan

DATA = Path(__file__).parent / "data" / "ddp_2rank"
HUGE = 16_000_000
"""A world size a manifest may claim (under :data:`MAX_WORLD_SIZE`) beside two rank files."""


def _copy(tmp_path: Path, **manifest: Any) -> Path:
    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    m = json.loads((run / "manifest.json").read_text())
    m.update(manifest)
    (run / "manifest.json").write_text(json.dumps(m))
    return run


def _peak(cli: Any, *args: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        r = cli(*args)
        return r, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("claim", ["1e8", str(2**70), "1e308", "-5", '"many"'])
def test_a_manifest_claiming_a_huge_world_is_damaged_not_believed(
    cli: Any, tmp_path: Path, claim: str
) -> None:
    run = _copy(tmp_path, world_size=json.loads(claim))
    r = cli("report", run, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["summary"]["world_size"] == 2 and d["problems"] == []
    (f,) = [f for f in d["summary"]["findings"] if f["kind"] == "manifest"]
    assert "manifest.json: damaged manifest (manifest.world_size" in f["title"]


def test_a_world_claimed_beside_two_rank_files_costs_what_the_files_cost(
    cli: Any, tmp_path: Path
) -> None:
    healthy, base = _peak(cli, "report", DATA, "--json")
    run = _copy(tmp_path, world_size=HUGE)
    claimed, peak = _peak(cli, "report", run, "--json", "--html", tmp_path / "r.html")
    assert healthy.returncode == 0 and claimed.returncode == 0, claimed.stderr
    assert peak < 2 * base + (16 << 20), (peak, base)  # a set of 16 M ranks alone is ~1 GB
    d, h = json.loads(claimed.stdout), json.loads(healthy.stdout)
    assert d["summary"]["world_size"] == HUGE
    assert d["problems"] == [
        {
            "rank": 2,
            "reason": "rank00002 … rank15999999 (15,999,998 ranks): missing",
            "last": HUGE - 1,
        }
    ]
    (miss,) = [f for f in d["failures"] if f["how"] == "missing"]
    assert (miss["rank"], miss["last"]) == (2, HUGE - 1)
    # the two ranks present are analysed as without the claim
    assert d["ranks"] == h["ranks"] and d["stragglers"] == h["stragglers"]
    text = cli("report", run)
    assert text.returncode == 0 and "not analyzed: 15,999,998 rank(s) (2–15,999,999)" in text.stdout


def test_rank_problems_are_spans_that_read_as_a_mapping() -> None:
    p = RankProblems(
        {3: "rank00003.npz: damaged"}, [RankSpan(0, 1, MISSING), RankSpan(5, 10**7, ELSEWHERE)]
    )
    assert len(p) == 3 + 10**7 - 4 and 3 in p and 4 not in p and 10**7 in p
    assert p[0] == "rank00000.npz: missing" and p.get(4) is None
    assert "on another node" in p[123_456]
    assert [(e.first, e.last) for e in p.entries()] == [(0, 1), (3, 3), (5, 10**7)]
    assert p.ranks_text() == "0–1, 3, 5–10,000,000"
    assert RankProblems({}, [RankSpan(2, 3, MISSING)]) == {
        2: "rank00002.npz: missing",
        3: "rank00003.npz: missing",
    }


def test_a_meta_or_a_folder_name_cannot_claim_past_the_bound(tmp_path: Path) -> None:
    from meshprof.records.codec import RecordError
    from meshprof.records.rank_meta import RankMeta

    for key, value in [("world_size", MAX_WORLD_SIZE + 1), ("rank", 2**70), ("rank", -7)]:
        with pytest.raises(RecordError, match=f"meta.{key}"):
            RankMeta.from_dict({key: value})
    run = _copy(tmp_path)
    (run / f"rank{10**12}").mkdir()  # a folder past every rank: not a rank's
    (run / f"rank{MAX_WORLD_SIZE}.npz").write_bytes(b"x")
    loaded = load_run(run)
    assert sorted(loaded.ranks) == [0, 1] and loaded.world_size == 2 and len(loaded.problems) == 0


def test_ranks_of_unread_nodes_are_spans_too(tmp_path: Path) -> None:
    run = _copy(tmp_path, world_size=HUGE, nnodes="2000000")
    loaded = load_run(run)
    (span,) = loaded.problems.spans
    assert (span.first, span.last, span.kind) == (2, HUGE - 1, ELSEWHERE)
    assert loaded.is_elsewhere(12_345_678) and not loaded.is_elsewhere(1)


def test_a_live_record_or_a_dump_claiming_a_huge_world_stays_bounded(
    cli: Any, tmp_path: Path
) -> None:
    from meshprof.analyze.hang.diagnose import diagnose_hang
    from meshprof.analyze.live.capture_targets import peer_of
    from meshprof.records.live import RankLive
    from meshprof.records.members import MAX_NAMED_RANKS
    from meshprof.rundir.live import write_rank_live

    for r in range(2):
        write_rank_live(
            tmp_path,
            RankLive(rank=r, updated_ns=time.time_ns(), interval_s=1.0, world_size=MAX_WORLD_SIZE),
        )
    # the capture's peer: found among the ranks looked at, not by sorting 16 M candidates
    t0 = time.monotonic()
    assert peer_of(MAX_WORLD_SIZE - 1, None, MAX_WORLD_SIZE)[0] == MAX_WORLD_SIZE - 2
    assert time.monotonic() - t0 < 5
    r = cli("top", "--once", "--json", tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["world_size"] == MAX_WORLD_SIZE
    hang = tmp_path / "hang"
    hang.mkdir()
    dump = {
        "format": "meshprof-hang/1",
        "rank": 0,
        "world_size": MAX_WORLD_SIZE,
        "reason": "hang",
        "events": [],
        "inflight": [{"op": "all_reduce", "group_name": "0", "seq": 3, "age_ns": 10**10}],
        "groups": [],
        "threads": [],
    }
    (hang / "rank0.json").write_text(json.dumps(dump))
    tracemalloc.start()
    try:
        diag = diagnose_hang(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert diag.world_size == MAX_WORLD_SIZE and peak < 256 << 20
    (no_dump,) = [f for f in diag.findings if f.kind == "no_dump"]
    assert len(no_dump.ranks) == MAX_NAMED_RANKS - 1  # named up to the bound, not 16 M
    dump["world_size"] = MAX_WORLD_SIZE + 1
    (hang / "rank0.json").write_text(json.dumps(dump))
    r = cli("hang", tmp_path)
    assert r.returncode == 2 and "rank0.json: unreadable" in r.stderr + r.stdout
