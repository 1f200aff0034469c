"""The hang watchdog: a daemon thread per rank that dumps what the rank was doing when a
collective has been in flight for too long.

A dump is one JSON file, ``DUMP_DIR/rank{r}.json`` (written atomically), holding the rank's last
N collectives, the ones in flight, and every thread's Python stack (file:line:function), with the
thread that issued the in-flight op marked. When PyTorch's Flight Recorder is on
(``TORCH_FR_BUFFER_SIZE``), its JSON dump is written next to it as ``fr_rank{r}.json``.

A rank that skipped a collective is not stuck in it, so it would never dump on its own. Two ways
make it dump too: a hang dump touches ``DUMP_DIR/trigger`` (a shared folder) and every watchdog
that sees the trigger change writes its own dump, and ``SIGUSR1`` (the launcher sends it to every worker after the first dump)
writes one from the signal handler. Nothing here ever raises into the training process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from meshprof.process import process_rank
from meshprof.rundir.confine import make_dirs
from meshprof.rundir.hang_dumps import dump_path, fr_dump_path

DUMP_FORMAT = "meshprof-hang/1"

#: Environment read by :func:`start_watchdog_from_env` (set by ``meshprof run`` for its workers).
ENV_DIR = "MESHPROF_HANG_DIR"
ENV_TIMEOUT = "MESHPROF_HANG_TIMEOUT"


def trigger_path(dump_dir: str | os.PathLike[str]) -> Path:
    """Touching this file makes every rank's watchdog write its dump (a hang dump touches it)."""
    return Path(dump_dir) / "trigger"


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _touch(path: Path, within: Path | None = None) -> int:
    """Touch ``path`` (created when missing, never through a link planted there; inside
    ``within`` when given); its new mtime, 0 on failure."""
    try:
        if within is not None:
            make_dirs(within, path.parent)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, 0o666)
        try:
            os.utime(fd if os.utime in os.supports_fd else path)
        finally:
            os.close(fd)
        return _mtime(path)
    except OSError:
        return 0


def thread_stacks() -> list[dict[str, Any]]:
    """Every thread's Python stack, outermost frame first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for tid, frame in sys._current_frames().items():
        frames = [
            {"file": fs.filename, "line": fs.lineno or 0, "function": fs.name}
            for fs in traceback.extract_stack(frame)
        ]
        out.append({"thread_id": tid, "name": names.get(tid, ""), "frames": frames})
    return out


def build_dump(
    prof: Any, reason: str, last_n: int = 64, threshold_s: float = 0.0
) -> dict[str, Any]:
    """The dump of this rank as a JSON-ready dict (see the module docstring)."""
    rank = process_rank()
    reading = prof.read()  # one instant: the completed events and the ops in flight
    inflight = [asdict(op) for op in reading.pending.ops]
    for op in inflight:
        op["group_ranks"] = list(op["group_ranks"])
    events = []
    done = prof.events(inflight=False, reading=reading) if last_n > 0 else []
    for e in done[-last_n:] if last_n > 0 else []:
        events.append(
            {
                "op": e.op,
                "group_name": e.group_name,
                "group_desc": e.group_desc,
                "group_ranks": list(e.group_ranks),
                "seq": int(e.seq),
                "peer": int(e.peer),
                "dtype": e.dtype,
                "in_bytes": int(e.in_bytes),
                "out_bytes": int(e.out_bytes),
                "start_ns": int(e.start_ns),
                "duration_ns": int(e.duration_ns),
                "state": "error" if e.status == "error" else "completed",
                "error": e.error,
            }
        )
    busy = {op["thread_id"] for op in inflight}
    stacks = thread_stacks()
    for s in stacks:
        s["inflight"] = s["thread_id"] in busy
        s["main"] = s["thread_id"] == threading.main_thread().ident
    groups = [
        {"name": g.name, "desc": g.desc, "ranks": list(g.ranks), "backend": g.backend}
        for g in prof.log.groups
    ]
    return {
        "format": DUMP_FORMAT,
        "rank": rank,
        "world_size": int(prof.world_size),
        "pid": os.getpid(),
        "hostname": os.uname().nodename,
        "reason": reason,
        "time_ns": time.time_ns(),
        "threshold_s": threshold_s,
        "step": int(prof.step),
        "groups": groups,
        "events": events,
        "inflight": inflight,
        "threads": stacks,
    }


def _flight_recorder_json() -> str | None:
    if int(os.environ.get("TORCH_FR_BUFFER_SIZE", "0") or 0) <= 0:
        return None
    try:
        import torch

        raw = torch._C._distributed_c10d._dump_fr_trace_json()  # type: ignore[attr-defined]
        return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except Exception:
        return None


def write_dump(
    prof: Any,
    dump_dir: str | os.PathLike[str],
    reason: str,
    last_n: int = 64,
    threshold_s: float = 0.0,
    within: Path | None = None,
) -> Path:
    """Write ``DUMP_DIR/rank{r}.json`` (and ``fr_rank{r}.json`` when the Flight Recorder is on);
    ``within``: the run directory the dump folder must lie in, every link resolved."""
    from meshprof.rundir.atomic import atomic_write_text

    if within is not None:
        make_dirs(within, dump_dir)
    data = build_dump(prof, reason, last_n, threshold_s)
    rank = data["rank"]
    fr = _flight_recorder_json()
    if fr is not None:
        atomic_write_text(fr_dump_path(dump_dir, rank), fr)
    return atomic_write_text(dump_path(dump_dir, rank), json.dumps(data))


class Watchdog:
    """Polls ``prof.inflight()``; see :func:`start_watchdog`."""

    def __init__(
        self,
        prof: Any,
        dump_dir: str | os.PathLike[str],
        timeout_s: float,
        poll_s: float = 0.5,
        last_n: int = 64,
        on_dump: Callable[[Path], None] | None = None,
        follow_peers: bool = True,
        within: str | os.PathLike[str] | None = None,
    ) -> None:
        self.prof = prof
        self.within = Path(within) if within is not None else None
        """The run directory the dumps must lie in (None: no such bound)."""
        self.dump_dir = Path(dump_dir)
        self.timeout_s = float(timeout_s)
        self.poll_s = float(poll_s)
        self.last_n = int(last_n)
        self.on_dump = on_dump
        self.follow_peers = follow_peers
        self.dumps: list[Path] = []
        """Paths written so far (a path repeats when it was rewritten)."""
        self._dumped_keys: set[tuple[str, int, str]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_dump_ns = 0
        self._trigger_seen = _mtime(trigger_path(self.dump_dir))
        self._thread = threading.Thread(target=self._run, name="meshprof-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (returns within one poll interval)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.poll_s + 1.0)

    def dump(self, reason: str) -> Path | None:
        """Write this rank's dump now; returns its path (None if writing failed).

        A "peer" or "signal" request does not overwrite this rank's hang dump while the op it
        describes is still in flight (it would say the same with a weaker reason)."""
        if reason != "hang":
            try:
                if any(
                    (op.group_name, op.seq, op.op) in self._dumped_keys
                    for op in self.prof.inflight()
                ):
                    return dump_path(self.dump_dir, process_rank())
            except Exception:
                pass
        with self._lock:
            try:
                path = write_dump(
                    self.prof, self.dump_dir, reason, self.last_n, self.timeout_s, self.within
                )
            except Exception as e:
                with contextlib.suppress(Exception):
                    self.prof.report_internal_error(e)
                return None
            self._last_dump_ns = time.time_ns()
            self.dumps.append(path)
        if self.on_dump is not None:
            with contextlib.suppress(Exception):
                self.on_dump(path)
        return path

    def check(self) -> Path | None:
        """One poll: dump if an op is past the threshold (once per op) or the trigger file is
        newer than this rank's last look at it."""
        limit = int(self.timeout_s * 1e9)
        for op in self.prof.inflight():
            key = (op.group_name, op.seq, op.op)
            if op.age_ns >= limit and key not in self._dumped_keys:
                self._dumped_keys.add(key)
                path = self.dump("hang")
                if path is not None and self.follow_peers:
                    self._trigger_seen = _touch(trigger_path(self.dump_dir), self.within)
                return path
        if self.follow_peers:
            mtime = _mtime(trigger_path(self.dump_dir))
            if mtime > self._trigger_seen:
                self._trigger_seen = mtime
                return self.dump("peer")
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception as e:
                with contextlib.suppress(Exception):
                    self.prof.report_internal_error(e)


_signal_watchdog: Watchdog | None = None


def _on_signal(signum: int, frame: Any) -> None:
    wd = _signal_watchdog
    if wd is not None:
        # write from a thread: the signal may have interrupted the watchdog holding its lock
        threading.Thread(target=wd.dump, args=("signal",), daemon=True).start()


def start_watchdog(
    prof: Any,
    dump_dir: str | os.PathLike[str],
    timeout_s: float,
    poll_s: float | None = None,
    *,
    last_n: int = 64,
    on_dump: Callable[[Path], None] | None = None,
    follow_peers: bool = True,
    signum: int | None = signal.SIGUSR1,
    within: str | os.PathLike[str] | None = None,
) -> Watchdog:
    """Start the watchdog of this process and return it (``.stop()`` ends it).

    When an op of ``prof`` has been in flight for ``timeout_s`` seconds, the rank writes
    ``dump_dir/rank{r}.json`` once for that op and calls ``on_dump(path)``. With
    ``follow_peers``, a hang dump also touches ``dump_dir/trigger``, and every rank whose watchdog
    sees the trigger change writes its own dump (reason "peer"); a launcher may touch it too.
    ``signum`` (SIGUSR1; None for none) is handled when called from the main thread: on that
    signal the rank dumps wherever it is. ``within``: the run directory the dumps must lie in,
    every link resolved (a dump folder replaced by a link out of it is not written).
    """
    global _signal_watchdog
    poll = poll_s if poll_s is not None else max(0.05, min(1.0, timeout_s / 4))
    wd = Watchdog(prof, dump_dir, timeout_s, poll, last_n, on_dump, follow_peers, within)
    if signum is not None and threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signum, _on_signal)
            _signal_watchdog = wd
        except (ValueError, OSError):
            pass
    return wd.start()


def start_watchdog_from_env(prof: Any) -> Watchdog | None:
    """Start a watchdog when ``$MESHPROF_HANG_DIR`` and ``$MESHPROF_HANG_TIMEOUT`` are set."""
    d = os.environ.get(ENV_DIR)
    t = os.environ.get(ENV_TIMEOUT)
    if not d or not t:
        return None
    try:
        return start_watchdog(prof, d, float(t))
    except Exception:
        return None


def wait_for_dumps(
    dump_dir: str | os.PathLike[str], world_size: int, timeout_s: float, poll_s: float = 0.1
) -> list[int]:
    """For the launcher: wait until every rank has dumped or ``timeout_s`` passed; return the
    ranks that dumped."""
    deadline = time.monotonic() + timeout_s
    while True:
        have = sorted(r for r in range(world_size) if dump_path(dump_dir, r).exists())
        if len(have) == world_size or time.monotonic() >= deadline:
            return have
        time.sleep(poll_s)


__all__ = [
    "DUMP_FORMAT",
    "ENV_DIR",
    "ENV_TIMEOUT",
    "Watchdog",
    "build_dump",
    "dump_path",
    "start_watchdog",
    "start_watchdog_from_env",
    "thread_stacks",
    "trigger_path",
    "wait_for_dumps",
    "write_dump",
]
