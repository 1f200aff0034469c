"""The typed record layer and its one codec (``meshprof.records``): JSON out of the types, typed
values back with errors that name the key, records that keep what they do not know, and every
field documented (the file-format page is generated from those docstrings)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from meshprof.records.codec import NOT_IN_JSON, RecordError, from_json, json_key, to_json
from meshprof.records.finding import FindingKind, Severity, severity_order
from meshprof.records.live import Alert, RankLive
from meshprof.records.manifest import Manifest
from meshprof.records.rank_meta import MonitorSettings, RankMeta
from meshprof.records.worker_settings import WORKER_ENV, WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
RECORD_MODULES = (
    "meshprof.records.rank_meta",
    "meshprof.records.manifest",
    "meshprof.records.live",
    "meshprof.records.finding",
    "meshprof.records.worker_settings",
    "meshprof.records.perfmon",
    "meshprof.records.captures",
    "meshprof.records.stacks",
    "meshprof.records.storage",
    "meshprof.records.serving",
)


@dataclass(frozen=True, slots=True)
class _Inner:
    x: float
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Outer:
    name: str
    inner: _Inner
    renamed: int = field(default=0, metadata=json_key("other"))
    big: np.ndarray = field(default_factory=lambda: np.zeros(2), metadata=NOT_IN_JSON)
    maybe: list[_Inner] | None = None
    kind: Severity = Severity.INFO


def test_to_json_follows_the_types() -> None:
    o = _Outer("a", _Inner(math.nan, ("t",)), renamed=3, maybe=[_Inner(math.inf)])
    assert to_json(o) == {
        "name": "a",
        "inner": {"x": None, "tags": ["t"]},  # NaN and inf as null, tuples as arrays
        "other": 3,  # written under its json_key
        "maybe": [{"x": None, "tags": []}],
        "kind": "info",  # an enum as its value
    }  # "big" is not in the JSON
    assert to_json({1: np.int64(2), "f": np.float32(0.5), "a": np.arange(3)}) == {
        "1": 2,
        "f": 0.5,
        "a": [0, 1, 2],
    }


def test_from_json_builds_the_types_back_and_names_what_does_not_fit() -> None:
    got = from_json(_Outer, {"name": "a", "inner": {"x": 1, "tags": ["t"]}, "other": 3})
    assert got.inner == _Inner(1.0, ("t",)) and got.renamed == 3 and got.maybe is None
    assert from_json(_Outer, {"name": "b", "inner": {"x": None}}).inner.x != 0  # null -> NaN
    with pytest.raises(RecordError, match=r"_Outer\.inner\.x: expected float, got 'fast'"):
        from_json(_Outer, {"name": "a", "inner": {"x": "fast"}})
    with pytest.raises(RecordError, match=r"_Outer: the key 'inner' is missing"):
        from_json(_Outer, {"name": "a"})
    with pytest.raises(RecordError, match=r"kind: expected one of .*got 'bad'"):
        from_json(_Outer, {"name": "a", "inner": {"x": 1}, "kind": "bad"})
    with pytest.raises(RecordError, match=r"maybe\[0\]\.x: expected float"):
        from_json(_Outer, {"name": "a", "inner": {"x": 1}, "maybe": [{"x": [1]}]})


def test_a_record_keeps_unknown_keys_and_their_order() -> None:
    raw = {
        "rank": 3,
        "from_the_future": {"a": 1},
        "monitor": {"schedule": "1F1B", "microbatches": 8, "new_setting": True},
        "groups": [{"name": "0", "ranks": [0, 1], "backend": "gloo", "color": "red"}],
        "writer": {"writes": 2, "interval_s": 30.0, "failures": 0},
    }
    meta = RankMeta.from_dict(raw)
    assert isinstance(meta.monitor, MonitorSettings) and meta.monitor.microbatches == 8
    assert meta.groups is not None and meta.groups[0].ranks == [0, 1]
    assert meta.writer is not None and meta.writer.writes == 2
    assert meta.to_dict() == raw and list(meta.to_dict()) == list(raw)
    assert meta.monitor.extra == {"new_setting": True}
    changed = meta.updated(writer={"writes": 3, "interval_s": 30.0, "failures": 0}, x=1)
    assert changed.writer is not None and changed.writer.writes == 3 and changed["x"] == 1
    with pytest.raises(RecordError, match=r"RankMeta\.writer\.writes: expected int, got '3'"):
        RankMeta.from_dict({"writer": {"writes": "3"}})
    with pytest.raises(RecordError, match=r"manifest\.nodes\[0\]\.ranks\[1\]: expected int"):
        Manifest.from_dict({"nodes": [{"ranks": [0, "one"]}]}, "manifest")


def test_records_read_and_pickled_quickly_are_the_same_records() -> None:
    # the fast paths (a scalar taken as it is; pickled as class + field values, rebuilt by a
    # per-class setter) change nothing a reader or another process sees
    raw = {
        "rank": 5,
        "hostname": "node0",
        "groups": [
            {"name": "0", "ranks": {"start": 0, "stop": 64, "step": 1}, "backend": "nccl"},
            {"name": "tp1", "ranks": [1, 5, 9], "backend": "nccl", "color": "red"},
        ],
        "clock_sync": {"method": "pg", "rank": 5, "samples": [[1, 2, 3]], "error": ""},
        "monitor": {"microbatches": 8, "new_setting": True},
        "unknown": [1, {"a": None}],
    }
    meta = RankMeta.from_dict(raw)
    back = pickle.loads(pickle.dumps(meta))
    assert back == meta and back.to_dict() == meta.to_dict() == raw
    assert back.key_order == meta.key_order and back.extra == {"unknown": [1, {"a": None}]}
    assert back.groups is not None and back.groups[1].extra == {"color": "red"}
    assert list(back.groups[0].ranks) == list(range(64))
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.rank = 6  # type: ignore[misc]
    # what the fast path must not take as it is: still decoded, or refused by the key
    with pytest.raises(RecordError, match=r"RankMeta\.rank: expected int, got True"):
        RankMeta.from_dict({"rank": True})
    with pytest.raises(RecordError, match=r"RankMeta\.hostname: .*fits none|expected str"):
        RankMeta.from_dict({"hostname": 3})
    assert (
        RankMeta.from_dict({"rank": 2.0}).rank == 2
        and RankMeta.from_dict({"rank": None}).rank is None
    )


def test_a_damaged_meta_is_one_clear_error_of_that_rank(tmp_path: Path) -> None:
    from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, SPAN_DTYPE
    from meshprof.rundir import RankData, load_rank_file, write_rank_file

    empty = {
        "events": np.zeros(0, EVENT_DTYPE),
        "spans": np.zeros(0, SPAN_DTYPE),
        "memory": np.zeros(0, MEMORY_DTYPE),
    }
    write_rank_file(tmp_path, RankData(rank=0, meta=RankMeta(rank=0), **empty))
    path = tmp_path / "rank00000.npz"
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays["meta"]).decode("utf-8"))
    meta["writer"] = {"writes": "many"}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    np.savez(path, **arrays)
    from meshprof.errors import MeshprofError

    with pytest.raises(MeshprofError, match=r"damaged rank file \(meta\.writer\.writes"):
        load_rank_file(path)


def test_worker_settings_travel_in_one_variable() -> None:
    s = WorkerSettings(
        run_dir="/r", node_id="h-1", hang_timeout_s=5.0, max_events=10, layout="2x1x2"
    )
    env = {WORKER_ENV: s.to_env()}
    assert WorkerSettings.from_env(env) == s
    assert WorkerSettings.from_env({}) is None
    with pytest.raises(RecordError, match=r"MESHPROF_WORKER\.max_events"):
        WorkerSettings.from_env({WORKER_ENV: json.dumps({"run_dir": "/r", "max_events": "ten"})})


def test_findings_share_kinds_and_severities() -> None:
    a = Alert(kind=FindingKind.STRAGGLER, title="rank 2 is slow", t_ns=5, ranks=(2,))
    d = a.to_dict()
    assert d["message"] == "rank 2 is slow" and d["kind"] == "straggler"
    assert d["severity"] == "warning" and d["ranks"] == [2]
    assert Alert.from_dict(json.loads(json.dumps(d))) == a
    assert f"{Severity.HIGH}" == "high" and json.dumps([Severity.HIGH]) == '["high"]'
    order = sorted(["low", "critical", "info", "warning", "unknown"], key=severity_order)
    assert order == ["critical", "warning", "low", "info", "unknown"]
    rec = RankLive(rank=1, updated_ns=2, interval_s=1.0)
    assert RankLive.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec


def _hook() -> object:
    spec = importlib.util.spec_from_file_location("records_hook", ROOT / "docs/_hooks/records.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("module", RECORD_MODULES)
def test_every_record_field_is_documented(module: str) -> None:
    """The file-format page (docs/formats.md) is generated from these docstrings."""
    fields = _hook().record_fields(module)  # type: ignore[attr-defined]
    assert fields
    missing = {c: [k for k, _, d in rows if not d] for c, (_, rows) in fields.items()}
    assert not {c: m for c, m in missing.items() if m}, missing


def test_the_formats_page_names_every_record_class() -> None:
    page = (ROOT / "docs/formats.md").read_text()
    for module in RECORD_MODULES:
        for cls in _hook().record_fields(module):  # type: ignore[attr-defined]
            if cls in {
                "LiveStraggler",
                "LiveSnapshot",
                "CommLogRow",
                "StrEnum",
                "Severity",
                "FindingKind",
                "CaptureState",
            }:
                continue  # not written to a file as such (a view, a row of another record)
            assert f" {cls} " in page or f" {cls} -->" in page, cls
