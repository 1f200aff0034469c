"""The live time ledger on a synthetic timeline with a known answer: a rank's steps accounted
once each by the report's definitions (data loading, exposed communication per dimension,
compute, idle outside steps), the parts adding up to the wall time at every record; and the
exporter's straggler-wait carving, whose counters only grow and still add up."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import numpy as np

from meshprof.analyze.live.badput import BadputBook
from meshprof.events import EVENT_DTYPE
from meshprof.records.live import RankLive
from meshprof.session.live_ledger import LiveLedger


def _span(kind: int, depth: int, name: int, step: int, start: int, dur: int, cpu: int) -> tuple:
    return (kind, 0, depth, name, step, start, dur, 0, 0, cpu)


def test_steps_are_accounted_once_by_the_reports_causes() -> None:
    log = SimpleNamespace(listeners=[])
    counters = SimpleNamespace(prof=SimpleNamespace(log=log), dim_of_group=lambda g: "dp")
    mon: Any = SimpleNamespace(span_rows=deque(), span_names=["data", "forward"])
    ledger = LiveLedger(counters)
    rec = RankLive(rank=0, updated_ns=0, interval_s=1.0)
    ledger.fill(rec, mon)  # attaches to the log; nothing yet
    assert rec.ledger_ns == {} and len(log.listeners) == 1
    ev = np.zeros(1, dtype=EVENT_DTYPE)
    ev["start_ns"], ev["duration_ns"], ev["step"] = 1500, 400, 0
    log.listeners[0](ev)
    # step 0 [1000, 2000): data [1000, 1300) on CPU; forward [1300, 2000), 300 on CPU, blocked
    # 400 in an all_reduce [1500, 1900)
    mon.span_rows.extend(
        [
            _span(1, 1, 0, 0, 1000, 300, 300),
            _span(1, 1, 1, 0, 1300, 700, 300),
            _span(0, 0, 0, 0, 1000, 1000, 600),
            _span(1, 1, 0, 1, 2500, 100, 100),  # step 1 in progress: not yet
        ]
    )
    ledger.fill(rec, mon)
    want = {"data_loading": 300, "exposed_comm_dp": 400, "compute": 300, "idle": 0}
    assert {k: v for k, v in rec.ledger_ns.items() if v} == {k: v for k, v in want.items() if v}
    assert rec.ledger_wall_ns == 1000 == sum(rec.ledger_ns.values())
    # step 1 [2500, 3000) ends: its data phase 100, the rest outside its phases idle (the
    # report's rule for a step with phases), and so is the gap [2000, 2500)
    mon.span_rows.append(_span(0, 0, 0, 1, 2500, 500, 500))
    ledger.fill(rec, mon)
    ledger.fill(rec, mon)  # once only
    assert rec.ledger_ns["idle"] == 500 + 400 and rec.ledger_ns["data_loading"] == 400
    assert rec.ledger_ns["compute"] == 300 and rec.ledger_ns["exposed_comm_dp"] == 400
    assert rec.ledger_wall_ns == 2000 == sum(rec.ledger_ns.values())
    # the rank ends at 3500: the tail is idle
    rec.status, rec.updated_ns = "ended", 3500
    ledger.fill(rec, mon)
    assert rec.ledger_wall_ns == 2500 == sum(rec.ledger_ns.values())
    assert rec.ledger_ns["idle"] == 1400 and rec.internal_errors == 0
    assert log.listeners == []


def test_straggler_wait_carving_only_grows_and_adds_up() -> None:
    book = BadputBook()
    rec = RankLive(rank=0, updated_ns=0, interval_s=1.0, started_ns=7)
    seen: dict[str, int] = {}
    for k, (dp, tp, wait, exposed) in enumerate(
        [(100, 0, 30, 40), (200, 100, 0, 40), (300, 100, 40, 40), (300, 100, 10, 0)]
    ):
        rec.ledger_ns = {"compute": 1000 * (k + 1), "exposed_comm_dp": dp, "exposed_comm_tp": tp}
        wall = sum(rec.ledger_ns.values())
        parts = book.update(rec, wait, exposed)
        assert sum(parts.values()) == wall
        assert all(parts.get(c, 0) >= seen.get(c, 0) for c in parts), (parts, seen)
        seen = parts
    # 75 % of the first 100, none of the next 200, all of the last 100
    assert seen["straggler_wait"] == 75 + 100 and seen["exposed_comm_dp"] == 125
    rec.started_ns = 8  # a new process of the rank: its book starts over
    assert book.update(rec, 0, 40)["straggler_wait"] == 0
