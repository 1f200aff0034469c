"""The Python kernel's completion of CUDA-timed ops, on fakes (no GPU needed): no Python callback
on a work's future (on an H200 every one ran on NCCL's thread and cost the training step 16-20 %),
an end event marked where the current stream is ordered after the op (a synchronous op's return,
``Work.wait()``), and a work seen complete by the poller keeping its host time, not device-timed."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from meshprof.comm import completion
from meshprof.comm.completion import Completion, PendingOp
from meshprof.events import FLAG_ASYNC, FLAG_DEVICE_TIMING


class FakeEvent:
    made: ClassVar[list[FakeEvent]] = []

    def __init__(self, enable_timing: bool = True) -> None:
        self.recorded = 0
        FakeEvent.made.append(self)

    def record(self) -> None:
        self.recorded += 1

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        return 1.5  # ms


class FakeWork:
    def __init__(self) -> None:
        self.done = False

    def is_completed(self) -> bool:
        return self.done

    def get_future(self) -> Any:
        raise AssertionError("no future callback may be asked for")


class Sink:
    def __init__(self) -> None:
        self.completed: list[tuple[PendingOp, int, int | None]] = []

    def complete(
        self, rec: PendingOp, end: int, err: BaseException | None, dur: int | None = None
    ) -> None:
        self.completed.append((rec, end, dur))

    def discard(self, rec: PendingOp) -> None:
        raise AssertionError("discarded")

    def report_internal_error(self, e: BaseException) -> None:
        raise e


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Sink:
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(completion._Work, "unbox", staticmethod(lambda w: w))
    FakeEvent.made.clear()
    return Sink()


def _rec(token: int) -> PendingOp:
    return PendingOp(
        op_name="all_reduce", flags=FLAG_ASYNC | FLAG_DEVICE_TIMING, token=token,
        start_event=FakeEvent(), t0=100,
    )  # fmt: skip


def test_waited_work_is_device_timed_without_a_future_callback(fakes: Sink) -> None:
    c = Completion(fakes)
    rec, work = _rec(1), FakeWork()
    c.watch(rec, ([], work), None)
    assert not fakes.completed and rec.end_event is None  # nothing until it is waited on
    c.work_waited(work, 5_000, None)  # Work.wait() returned on the issuing thread
    assert rec.end_event is not None and rec.end_event.recorded == 1
    c.resolve_device()
    ((done, end, dur),) = fakes.completed
    assert done is rec and end == 5_000 and dur == 1_500_000
    c.stop()


def test_synchronous_op_without_a_work_ends_on_the_current_stream(
    fakes: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Completion(fakes)
    rec = _rec(2)
    monkeypatch.setattr(completion._Work, "unbox", staticmethod(lambda w: None))
    c.watch(rec, ([], object()), None)  # NCCL, async_op=False: no work
    assert rec.end_event is not None and rec.end_event.recorded == 1
    c.resolve_device()
    ((done, _end, dur),) = fakes.completed
    assert done is rec and dur == 1_500_000


def test_polled_work_keeps_its_host_time(fakes: Sink) -> None:
    c = Completion(fakes)
    rec, work = _rec(3), FakeWork()
    c.watch(rec, ([], work), None)  # a work DDP's reducer consumes in C++
    work.done = True
    c.poller.settle(1.0)
    ((done, end, dur),) = fakes.completed
    assert done is rec and dur is None and end > 0  # host time: issue -> seen complete
    assert not rec.flags & FLAG_DEVICE_TIMING and rec.start_event is None
    c.stop()
