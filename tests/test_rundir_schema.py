"""The run directory's schema: a golden 2-rank DDP run (tests/data/ddp_2rank, written by a real
`meshprof run --nproc-per-node 2` of tests/scripts/run_ddp.py with 3 optimizer steps and
MESHPROF_LAYOUT=dp=2,tp=1,pp=1, by meshprof as it was before RankMeta / Manifest existed) loads
through RankMeta / Manifest with the fields and analysis numbers it had when it was recorded, and
re-encodes to the same JSON byte for byte. A change of the format breaks these tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meshprof.analyze.run.events.clock import align_clocks
from meshprof.analyze.run.events.match import match_collectives
from meshprof.analyze.run.events.table import build_event_table
from meshprof.events import OP_NAMES
from meshprof.layout import Layout
from meshprof.records.rank_meta import MonitorSettings
from meshprof.rundir import (
    Manifest,
    RankData,
    RankMeta,
    load_rank_file,
    load_run,
    rank_file,
    resolve_layout,
    write_manifest,
    write_rank_file,
)
from meshprof.rundir.manifest import read_manifest
from meshprof.rundir.schema import RANK_FORMAT, RUN_FORMAT, ExitStatus

GOLDEN = Path(__file__).parent / "data" / "ddp_2rank"
OPS = ["all_gather", "broadcast", "broadcast", "all_reduce", "broadcast", "broadcast"] + [
    "all_reduce"
] * 3


def test_golden_manifest_fields() -> None:
    run = load_run(GOLDEN)
    m = run.manifest
    assert isinstance(m, Manifest) and m.format == RUN_FORMAT
    assert (m.world_size, m.exit_code, m.status, m.torchrun_exit_code) == (2, 0, "ok", 0)
    assert m.layout == {"dp": 2, "tp": 1, "pp": 1} and m.nnodes == "1"
    assert m.target is not None and m.target["args"][-1] == "3"
    assert m.rank_exit_codes == {"0": 0, "1": 0} and m.missing_ranks == {}
    assert m.nodes is not None and [n["ranks"] for n in m.nodes] == [[0, 1]]
    assert m.start_ns is not None and m.end_ns is not None and m.end_ns > m.start_ns
    assert m.settings is not None and m.settings["step_detect"] == "optimizer"
    assert m.extra == {}  # every key of this version is a typed field
    assert m["status"] == "ok"  # the JSON view by on-disk key


def test_golden_rank_meta_fields() -> None:
    run = load_run(GOLDEN)
    assert sorted(run.ranks) == [0, 1] and run.problems == {} and run.world_size == 2
    for r, rd in run.ranks.items():
        meta = rd.meta
        assert isinstance(meta, RankMeta) and meta.format == RANK_FORMAT
        assert (meta.rank, meta.world_size, meta.backend) == (r, 2, "gloo")
        assert meta.exit == ExitStatus("normal", 0, "", meta.exit.t_ns if meta.exit else 0)
        assert meta.steps_detected == 3 and meta.step_detection == "optimizer"
        assert meta.total_events == meta.retained_events == 9 and meta.evicted_events == 0
        assert [g.to_dict() for g in meta.groups or []] == [
            {"name": "0", "desc": "default_pg", "ranks": [0, 1], "backend": "gloo"}
        ]
        assert meta.layout == {"dp": 2, "tp": 1, "pp": 1} and not meta.layout_assumed
        assert meta.node_id == "vm-7930" and meta.local_rank == r and meta.node_rank == 0
        assert meta.writer is not None and meta.writer["failures"] == 0
        assert meta.extra == {}
        assert [OP_NAMES[c] for c in rd.events["op"].tolist()] == OPS
        assert rd.events["in_bytes"].tolist() == [8, 96, 360, 360, 20, 4, 360, 360, 20]
        assert rd.span_names == ["step"] and rd.spans["kind"].tolist() == [0, 0, 0]
        assert len(rd.memory) == 3
        assert resolve_layout(meta, run.manifest) == Layout(dp=2)
    # rank 1 measured its clock against rank 0 after init_process_group
    cs = run.ranks[1].meta.clock_sync
    assert cs is not None and cs["ref_rank"] == 0 and len(cs["samples"]) == 20
    assert run.ranks[0].meta.clock_sync is not None
    assert not run.ranks[0].meta.clock_sync["samples"]


def test_golden_analysis_numbers() -> None:
    run = load_run(GOLDEN)
    table = build_event_table(run)
    assert [(g.name, g.ranks, g.dimension) for g in table.groups] == [("0", (0, 1), "dp")]
    match = match_collectives(table, align_clocks(run, table))
    assert len(match) == 9 and bool(match.complete.all())
    for rd in run.ranks.values():  # the exact statistics agree with the retained events
        stats = rd.meta.stats
        assert stats is not None
        assert sum(int(row["count"]) for row in stats["rows"]) == 9


def test_golden_files_re_encode_byte_for_byte(tmp_path: Path) -> None:
    text = (GOLDEN / "manifest.json").read_text(encoding="utf-8")
    m = read_manifest(GOLDEN)
    assert json.dumps(m.to_dict(), indent=2, default=str) == text
    write_manifest(tmp_path, m)
    assert (tmp_path / "manifest.json").read_text(encoding="utf-8") == text
    for r in (0, 1):
        with np.load(rank_file(GOLDEN, r), allow_pickle=False) as z:
            raw = bytes(z["meta"])
        rd = load_rank_file(rank_file(GOLDEN, r))
        assert json.dumps(rd.meta.to_dict(), default=str).encode("utf-8") == raw
        write_rank_file(tmp_path, rd)
        with np.load(rank_file(tmp_path, r), allow_pickle=False) as z:
            assert bytes(z["meta"]) == raw
            assert np.array_equal(z["events"], rd.events)


def test_unknown_keys_are_kept_and_nested_types_are_read() -> None:
    d = {
        "rank": 3,
        "future_key": {"a": [1, 2]},
        "exit": {"how": "signal", "code": 143, "error": "SIGTERM", "t_ns": 5},
        "first_internal_error": None,
    }
    meta = RankMeta.from_dict(d)
    assert meta.extra == {"future_key": {"a": [1, 2]}} and meta.exit == ExitStatus(
        "signal", 143, "SIGTERM", 5
    )
    assert meta.to_dict() == d and list(meta.to_dict()) == list(d)  # order and nulls kept
    assert "first_internal_error" in meta and meta["future_key"] == {"a": [1, 2]}
    later = meta.updated(world_size=4, other=1, exit={"how": "normal", "code": 0})
    assert later.world_size == 4 and later.extra["other"] == 1
    assert later.exit == ExitStatus("normal", 0)
    assert list(later.to_dict())[-2:] == ["world_size", "other"]
    built = RankMeta(rank=0, world_size=2)
    assert built.to_dict() == {"rank": 0, "world_size": 2}  # unset fields are not written
    with pytest.raises(KeyError):
        built["hostname"]


def test_rank_file_round_trip_keeps_unknown_keys(tmp_path: Path) -> None:
    from data.meshprof_synth import events_array, memory_array, spans_array

    meta = RankMeta.from_dict({"rank": 1, "world_size": 2, "from_the_future": [1]})
    write_rank_file(
        tmp_path, RankData(1, events_array([]), spans_array([]), memory_array([]), meta)
    )
    back = load_rank_file(rank_file(tmp_path, 1))
    assert back.meta == meta and back.meta.extra == {"from_the_future": [1]}


def test_resolve_layout_precedence() -> None:
    mon = RankMeta(monitor=MonitorSettings(layout={"dp": 1, "tp": 2, "pp": 1}), layout={"dp": 2})
    manifest = Manifest(layout={"pp": 2})
    assert resolve_layout(mon, manifest) == Layout(tp=2)
    assert resolve_layout(RankMeta(layout={"dp": 2}), manifest) == Layout(dp=2)
    assert resolve_layout(RankMeta(), manifest) == Layout(pp=2)
    assert resolve_layout(None, None) is None
    assert resolve_layout(RankMeta(layout={"dp": "x"}), None) is None  # unreadable: unknown


def test_lean_read_of_a_stored_member_equals_the_full_read_and_checks_its_crc(
    tmp_path: Path,
) -> None:
    """The lean reader reads an uncompressed events member with os.pread (GIL released): the
    same rows as np.load's full read, and a flipped byte in the data is a damaged file, as
    zipfile's own CRC check makes it."""
    import shutil
    import zipfile

    from meshprof.errors import MeshprofError

    src = rank_file(GOLDEN, 0)
    full = load_rank_file(src)
    lean = load_rank_file(src, lean=True)
    done = full.events[full.events["duration_ns"] >= 0]
    assert len(lean.events) == len(done) > 0
    for name in lean.events.dtype.names or ():
        assert (lean.events[name].astype(np.int64) == done[name].astype(np.int64)).all()
    with zipfile.ZipFile(src) as zf:
        info = zf.getinfo("events.npy")
        assert info.compress_type == zipfile.ZIP_STORED  # (the path under test)
    bad = tmp_path / src.name
    shutil.copy(src, bad)
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for at in (start + info.file_size - 1, start + 200):  # in the rows; in the .npy header
        data = bytearray(src.read_bytes())
        data[at] ^= 0xFF
        bad.write_bytes(bytes(data))
        with pytest.raises(MeshprofError, match="damaged rank file"):
            load_rank_file(bad, lean=True)


def test_long_member_lists_parsed_once_and_equal_to_json():
    """Every rank file lists the world group's members: the loader parses each long list once
    per run and shares it; the meta it returns equals ``json.loads`` of the same text, also
    for compact separators, short lists and a long list outside the groups."""
    import json

    from meshprof.rundir.rankfile import parse_meta as _parse_meta

    world = list(range(2000))
    metas = [
        {
            "rank": r,
            "groups": [
                {"name": "0", "desc": "default_pg", "ranks": world, "backend": "gloo"},
                {"name": f"tp{r}", "ranks": [r, r + 1]},
                {"name": "dp", "ranks": list(range(r, 2000, 2))},
            ],
            "clock_sync": {"samples": [[1, 2, 3]]},
        }
        for r in range(3)
    ]
    shared: dict[str, list[int]] = {}
    got = []
    for m in metas:
        for text in (json.dumps(m), json.dumps(m, separators=(",", ":"))):
            out = _parse_meta(text, shared)
            assert out == json.loads(text) == m
            got.append(out)
    # one parsed world list per distinct text (the separators differ): shared by all ranks;
    # the short lists are each rank's own
    assert len({id(o["groups"][0]["ranks"]) for o in got[0::2]}) == 1
    assert len({id(o["groups"][0]["ranks"]) for o in got[1::2]}) == 1
    assert got[0]["groups"][1]["ranks"] is not got[2]["groups"][1]["ranks"]
    # a long list that is not a group's members: parsed as it is
    odd = {"groups": [], "extra": {"ranks": world}}
    text = json.dumps(odd)
    assert _parse_meta(text, shared) == odd
    assert _parse_meta("{}", shared) == {} and _parse_meta(text, None) == odd
