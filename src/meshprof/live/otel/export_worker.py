"""Sending without ever waiting: one thread per signal with a bounded queue
(:class:`ExportWorker`).

Whoever has something to send hands it to :meth:`ExportWorker.offer`, which only appends (or
drops what does not fit, counted); the worker's thread sends in batches through the SDK's
exporter, which may block on a slow or dead backend (it retries until its timeout) — only that
thread waits. What failed to send is dropped and counted, never retried by meshprof. At the end
the worker gets a deadline to send what it holds; past it, the exporter is shut down (which
ends its retries) and the rest is counted as dropped.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

QUEUE_FULL = "queue_full"
EXPORT_FAILED = "export_failed"
NOT_SENT = "not_sent"
"""Still queued when the exporter stopped (its deadline passed)."""


class ExportWorker:
    """One signal's sending thread and its bounded queue.

    ``send(batch)`` sends and says whether it worked; ``size(item)`` is what an item counts
    for (a span 1, a metric export its points); ``capacity`` bounds the items queued; with
    ``keep_newest`` a full queue drops its oldest item for the new one (metrics: the newest
    figures matter), else the new item is dropped (spans)."""

    def __init__(
        self,
        signal: str,
        send: Callable[[list[Any]], bool],
        *,
        capacity: int,
        batch: int,
        period_s: float,
        keep_newest: bool = False,
        size: Callable[[Any], int] | None = None,
        on_count: Callable[[str, str, int], None] | None = None,
        close: Callable[[], None] | None = None,
    ) -> None:
        self.signal = signal
        self.send = send
        self.capacity = max(int(capacity), 1)
        self.batch = max(int(batch), 1)
        self.period_s = float(period_s)
        self.keep_newest = keep_newest
        self.size = size or (lambda _x: 1)
        self.on_count = on_count
        """Called with (signal, outcome, n): outcome ``exported`` or a drop reason."""
        self.close = close
        self._q: deque[Any] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None
        self.sending = False
        """A send is in progress (on a slow backend: for its whole timeout)."""

    def start(self) -> ExportWorker:
        self._thread = threading.Thread(
            target=self._run, name=f"meshprof-otlp-{self.signal}", daemon=True
        )
        self._thread.start()
        return self

    def offer(self, items: Sequence[Any]) -> None:
        """Queue ``items`` (never blocks; what does not fit is dropped and counted)."""
        dropped = 0
        with self._cond:
            if self._stopping:
                dropped = sum(self.size(x) for x in items)
            else:
                for x in items:
                    if len(self._q) < self.capacity:
                        self._q.append(x)
                    elif self.keep_newest:
                        dropped += self.size(self._q.popleft())
                        self._q.append(x)
                    else:
                        dropped += self.size(x)
                if len(self._q) >= self.batch:
                    self._cond.notify()
        if dropped:
            self._count(QUEUE_FULL, dropped)

    def queued(self) -> int:
        with self._cond:
            return len(self._q)

    def stop(self, timeout_s: float) -> None:
        """Send what is queued within ``timeout_s`` seconds, then stop (see :meth:`finish`)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        self.request_stop(deadline)
        self.finish(deadline)

    def request_stop(self, deadline: float) -> None:
        """Take nothing more; send what is queued until ``deadline`` (monotonic seconds)."""
        with self._cond:
            self._stopping = True
            self._deadline = deadline
            self._cond.notify()

    def finish(self, deadline: float) -> None:
        """Wait for the thread until ``deadline``; then close the exporter (which ends a send
        still retrying), and count what is left as not sent."""
        if self._thread is not None:
            self._thread.join(max(deadline - time.monotonic(), 0.0) + 0.05)
        alive = self._thread is not None and self._thread.is_alive()
        if self.close is not None:
            with contextlib.suppress(Exception):
                self.close()
        if alive and self._thread is not None:
            self._thread.join(0.2)  # (a request the backend still holds is abandoned)
        with self._cond:
            rest = sum(self.size(x) for x in self._q)
            self._q.clear()
        if rest:
            self._count(NOT_SENT, rest)

    def _count(self, outcome: str, n: int) -> None:
        if self.on_count is not None and n:
            self.on_count(self.signal, outcome, n)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and len(self._q) < self.batch:
                    self._cond.wait(self.period_s)
                if self._stopping and (not self._q or time.monotonic() >= self._deadline):
                    return
                batch = [self._q.popleft() for _ in range(min(self.batch, len(self._q)))]
                self.sending = bool(batch)
            if not batch:
                continue
            n = sum(self.size(x) for x in batch)
            try:
                ok = bool(self.send(batch))
            except Exception:
                ok = False
            finally:
                self.sending = False
            self._count("exported" if ok else EXPORT_FAILED, n)


__all__ = ["EXPORT_FAILED", "NOT_SENT", "QUEUE_FULL", "ExportWorker"]
