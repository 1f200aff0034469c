"""``meshprof run --capture-on``: the launcher's alert watcher (:mod:`meshprof.live.watch`) asks
this trigger for a capture when an alert of a chosen kind is raised. It picks the culprit and a
healthy peer (:mod:`meshprof.analyze.live.capture_targets`), captures them
(:func:`~meshprof.live.capture_request.run_capture`) and returns what the alert's
``--alert-cmd`` payload carries as ``capture`` (:class:`~meshprof.records.captures.AlertCapture`).

Limits: one capture at a time; at most ``max_per_hour`` started in any hour; none once
``RUN_DIR/captures`` holds ``max_bytes`` (and the ranks keep no trace past it). On a forming
hang the ranks may never reach a step boundary: the capture waits at most 10 s and every
rank's stacks are taken and clustered (:mod:`meshprof.analyze.hang.stacks`).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from meshprof.analyze.hang.stacks import snapshot_of
from meshprof.analyze.live.capture_targets import HANG_KINDS, CaptureConfig, choose_targets
from meshprof.layout import Layout
from meshprof.records.captures import AlertCapture, CaptureRequest
from meshprof.records.live import Alert, LiveSnapshot
from meshprof.records.members import named_world
from meshprof.rundir.captures import capture_dir, captures_bytes
from meshprof.rundir.requests import new_request_id

#: A forming hang's capture waits at most this long for its ranks.
HANG_TIMEOUT_S = 10.0
#: Seconds every rank has to answer the stacks request of a forming hang.
STACKS_TIMEOUT_S = 5.0
#: Differences a payload carries.
PAYLOAD_DIFFERENCES = 10


class CaptureTrigger:
    """Captures on alerts, within the limits of :class:`CaptureConfig`; thread-safe."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        config: CaptureConfig,
        layout: Layout | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.layout = layout
        self.say = say
        self.started: collections.deque[float] = collections.deque()
        """Monotonic times of the captures started in the last hour."""
        self.skipped = 0
        self._busy = threading.Lock()

    def wants(self, alert: Alert) -> bool:
        """``alert``'s kind is one ``--capture-on`` names."""
        return alert.kind in self.config.kinds

    def capture(self, alert: Alert, snap: LiveSnapshot, now: float | None = None) -> AlertCapture:
        """Capture for ``alert`` (blocking: the steps plus a few seconds), or say why not."""
        mono = time.monotonic() if now is None else now
        while self.started and mono - self.started[0] >= 3600.0:
            self.started.popleft()
        if len(self.started) >= self.config.max_per_hour:
            return self._skip(
                f"rate limit: {len(self.started)} capture(s) started in the last hour "
                f"(--capture-max-per-hour {self.config.max_per_hour})"
            )
        used = captures_bytes(self.run_dir)
        if used >= self.config.max_bytes:
            return self._skip(
                f"disk budget spent: the captures take {used:,} bytes "
                f"(--capture-max-bytes {self.config.max_bytes:,})"
            )
        if not self._busy.acquire(blocking=False):
            return self._skip("another capture is running")
        try:
            world = snap.world_size if snap.world_size > 0 else len(snap.ranks)
            targets = choose_targets(alert.kind, alert.ranks, snap, self.layout, world)
            if targets is None:
                return self._skip("no rank to capture (no live state)")
            self.started.append(mono)
            hang = alert.kind in HANG_KINDS
            stacks: tuple[str, ...] = ()
            if hang:
                stacks = self._stacks(snap, world)
            req = CaptureRequest(
                id=new_request_id(),
                ranks=targets.ranks,
                steps=self.config.steps,
                trigger=str(alert.kind),
                reason=targets.reason,
                requested_ns=time.time_ns(),
                timeout_s=min(self.config.timeout_s, HANG_TIMEOUT_S)
                if hang
                else self.config.timeout_s,
                max_bytes=self.config.max_bytes,
            )
            from meshprof.live.capture_request import RequestRefusedError, run_capture

            try:
                comp = run_capture(self.run_dir, req)
            except RequestRefusedError as e:
                return self._skip(str(e))
            return AlertCapture(
                status=comp.state,
                message=comp.message,
                id=req.id,
                dir=str(capture_dir(self.run_dir, req.id)),
                trigger=req.trigger,
                ranks=req.ranks,
                reason=req.reason,
                steps=req.steps,
                requested_ns=req.requested_ns,
                analysed_ns=time.time_ns(),
                differences=comp.differences[:PAYLOAD_DIFFERENCES],
                stacks=stacks,
            )
        finally:
            self._busy.release()

    def _stacks(self, snap: LiveSnapshot, world: int) -> tuple[str, ...]:
        from meshprof.live.capture_request import take_stacks

        expected = [r for r, x in snap.ranks.items() if x.status == "running"]
        t0 = time.monotonic()
        rid, got = take_stacks(self.run_dir, expected, STACKS_TIMEOUT_S)
        asked = list(named_world(world))
        return snapshot_of(rid, asked, got, time.monotonic() - t0).clusters.lines

    def _skip(self, why: str) -> AlertCapture:
        self.skipped += 1
        return AlertCapture(status="skipped", message=why)


__all__ = ["HANG_TIMEOUT_S", "CaptureTrigger"]
