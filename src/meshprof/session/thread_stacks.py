"""Every thread's Python stack in this process, as a :class:`~meshprof.records.stacks.RankStacks`
(a ``meshprof stacks`` answer, or where a rank was when its capture timed out)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback

from meshprof.records.stacks import RankStacks, StackFrame, ThreadStack


def thread_stacks_now(rank: int, request_id: str = "", step: int = -1) -> RankStacks:
    """Every thread's Python stack in this process, now (the main thread first)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads = []
    for tid, frame in sys._current_frames().items():
        frames = tuple(
            StackFrame(fs.filename, fs.lineno or 0, fs.name)
            for fs in traceback.extract_stack(frame)
        )
        threads.append(ThreadStack(int(tid), names.get(tid, ""), tid == main, frames))
    threads.sort(key=lambda t: (not t.main, t.name, t.thread_id))
    return RankStacks(
        id=request_id,
        rank=rank,
        taken_ns=time.time_ns(),
        pid=os.getpid(),
        hostname=socket.gethostname(),
        step=step,
        threads=tuple(threads),
    )


__all__ = ["thread_stacks_now"]
