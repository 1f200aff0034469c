"""Hypothesis over what meshprof reads from files others write (issue 39): any JSON value given to
a record of the run directory either reads or raises the one error the loaders turn into "damaged
file" (never another exception), a request that reads has an id that is a file name, and the
missing ranks kept as spans say exactly what a set of every rank would (a model written here,
one entry per rank, on worlds small enough for it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshprof.records.captures import CaptureRankStatus, CaptureRequest
from meshprof.records.codec import RecordError
from meshprof.records.live import Alert, RankLive
from meshprof.records.manifest import Manifest, NodeSummary
from meshprof.records.members import MAX_WORLD_SIZE
from meshprof.records.names import is_id
from meshprof.records.rank_meta import RankMeta
from meshprof.records.stacks import RankStacks, StacksRequest
from meshprof.records.storage import SegmentHeader
from meshprof.rundir.confine import OutsideRunDirError, check_name, confined_write
from meshprof.rundir.rank_problems import (
    ELSEWHERE,
    MISSING,
    RankProblems,
    missing_spans,
    rank_reason,
    split_elsewhere,
)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["..", "../../x", "/tmp/x", "a/b", ".", "ok-id", "rank00001", "\x00"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)

RECORDS: dict[type, tuple[str, ...]] = {
    Manifest: (
        "world_size",
        "nnodes",
        "nproc_per_node",
        "node_rank",
        "layout",
        "rank_exit_codes",
        "nodes",
    ),
    RankMeta: ("rank", "world_size", "groups", "local_rank", "exit", "recovered", "monitor"),
    RankLive: ("rank", "updated_ns", "interval_s", "world_size", "inflight", "status"),
    CaptureRequest: (
        "id",
        "ranks",
        "steps",
        "requested_ns",
        "timeout_s",
        "activities",
        "max_bytes",
    ),
    StacksRequest: ("id", "ranks", "requested_ns", "timeout_s"),
    CaptureRankStatus: ("id", "rank", "state", "updated_ns", "steps", "where"),
    RankStacks: ("id", "rank", "taken_ns", "threads"),
    NodeSummary: ("node_id", "node_rank", "ranks", "exit_code", "end_ns"),
    Alert: ("kind", "message", "t_ns", "ranks", "value"),
    SegmentHeader: ("format", "rank", "generation", "dtypes"),
}
"""The records of the run directory's files, and keys each reads (others are drawn too)."""


def _objects(keys: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(
        st.sampled_from(keys) | st.text(max_size=8), JSON, max_size=len(keys) + 2
    )


def _read(cls: type, value: Any) -> Any:
    """``cls.from_dict(value)``; the records whose reader takes a file name get one."""
    if cls in (Manifest, RankMeta, NodeSummary):
        return cls.from_dict(value, "x")
    return cls.from_dict(value)


@pytest.mark.parametrize("cls", list(RECORDS), ids=lambda c: c.__name__)
@pytest.mark.parametrize("key", ["world_size", "rank", "node_rank"])
@pytest.mark.parametrize("value", [-2, MAX_WORLD_SIZE + 1, 1 << 62])
def test_a_rank_or_world_size_out_of_range_is_a_record_error(
    cls: type, key: str, value: int
) -> None:
    """Every record that has the key refuses a value below -1 (unknown) or over
    MAX_WORLD_SIZE. (Hypothesis found ``{"rank": -2}`` read as a segment header's rank in CI,
    and the same held for a node summary's node_rank.)"""
    try:
        rec = _read(cls, {key: value})
    except RecordError:
        return
    assert getattr(rec, key, None) is None  # (a key the record does not know goes to extra)


@pytest.mark.parametrize("cls", list(RECORDS), ids=lambda c: c.__name__)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_json_reads_or_is_one_record_error(cls: type, data: st.DataObject) -> None:
    value = data.draw(st.one_of(_objects(RECORDS[cls]), JSON))
    try:
        rec = _read(cls, value)
    except RecordError:
        return
    for key in ("world_size", "rank", "node_rank"):
        got = getattr(rec, key, None)
        assert got is None or -1 <= got <= MAX_WORLD_SIZE
    if isinstance(rec, CaptureRequest | StacksRequest):
        assert is_id(rec.id) and "/" not in rec.id and rec.id not in (".", "..")
        assert all(0 <= r < MAX_WORLD_SIZE for r in rec.ranks)
    json.dumps(rec.to_dict())  # what reads writes back


@settings(max_examples=200, deadline=None)
@given(
    world=st.integers(0, 300),
    present=st.sets(st.integers(0, 320), max_size=40),
    listed=st.sets(st.integers(0, 320), max_size=40),
    away=st.booleans(),
)
def test_missing_spans_say_what_a_set_of_every_rank_says(
    world: int, present: set[int], listed: set[int], away: bool
) -> None:
    spans = missing_spans(world, present)
    if away:
        spans = split_elsewhere(spans, listed)
    damaged = {r: f"rank{r:05d}.npz: damaged" for r in sorted(present)[:3]}
    p = RankProblems(damaged, spans)
    model = dict(damaged)
    for r in range(world):
        if r not in present:
            model[r] = rank_reason(ELSEWHERE if away and r not in listed else MISSING, r)
    assert len(p) == len(model) and dict(p.items()) == model and p == model
    for r in range(-2, world + 3):
        assert (r in p) == (r in model) and p.get(r) == model.get(r)
    assert sum(e.last - e.first + 1 for e in p.entries()) == len(model)
    assert len(spans) <= len(present) + 1 + (2 * len(listed) if away else 0)


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=12))
def test_a_name_is_one_path_component(name: str) -> None:
    try:
        check_name(name)
    except OutsideRunDirError:
        return
    assert name not in ("", ".", "..") and "/" not in name and "\x00" not in name
    assert Path(name).name == name


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.lists(st.sampled_from(["a", "b", "..", ".", "link", "c/d", ""]), max_size=3))
def test_confined_writes_stay_inside(tmp_path: Path, parts: list[str]) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(exist_ok=True)
    outside.mkdir(exist_ok=True)
    if not (root / "link").is_symlink():
        (root / "link").symlink_to(outside, target_is_directory=True)
    try:
        path = confined_write(root, parts, "x.json", b"{}")
    except OutsideRunDirError:
        pass
    else:
        assert path.resolve().is_relative_to(root.resolve())
    assert list(outside.iterdir()) == []
