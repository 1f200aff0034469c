"""Which requests a rank takes: the posted files of ``RUN_DIR/requests`` are input from anyone
who can write the run directory (:mod:`meshprof.rundir.requests`), so before the capture agent
acts on one it must be

* a request: a regular file of a few kB whose id is a name and the id of its file name (the
  records check the rest: steps, ranks, timeouts in range);
* the job's user's, by the file's owner, unless the job takes other users' requests
  (:attr:`~meshprof.records.captures.CaptureLimits.any_user`);
* within the job's limits (:class:`~meshprof.records.captures.CaptureLimits`): steps,
  activities, timeout; the disk budget and the rates are applied when the rank acts on it;
* not from the future (a request's timeout counts from its ``requested_ns``).

A request refused says why once: one :class:`~meshprof.records.captures.RequestRefusal` in
``RUN_DIR/requests/refused/`` (the first rank's; the asker prints it and stops waiting)."""

from __future__ import annotations

import collections
import os
import socket
import time
from collections.abc import Callable

from meshprof.records.captures import CaptureLimits, CaptureRequest, RequestRefusal
from meshprof.rundir.requests import PostedRequest, Request, write_refusal

FUTURE_S = 300.0
"""A request stamped more than this many seconds ahead of the rank's clock is refused (hosts'
clocks differ by far less): its timeout would keep a rank armed for as long."""
HOUR_S = 3600.0


def _user(uid: int) -> str:
    """``name (uid)``, or the uid alone where there is no such user."""
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} ({uid})"
    except (ImportError, KeyError, OverflowError):
        return str(uid)


class RateWindow:
    """At most ``per_hour`` events in any hour (monotonic clock)."""

    def __init__(self, per_hour: int) -> None:
        self.per_hour = int(per_hour)
        self._times: collections.deque[float] = collections.deque()

    def full(self, now: float | None = None) -> bool:
        """No room for another event now."""
        t = time.monotonic() if now is None else now
        while self._times and t - self._times[0] >= HOUR_S:
            self._times.popleft()
        return len(self._times) >= self.per_hour

    def allow(self, now: float | None = None) -> bool:
        """Take one event now if the window has room (True), else False."""
        t = time.monotonic() if now is None else now
        if self.full(t):
            return False
        self._times.append(t)
        return True

    def next_in_s(self, now: float | None = None) -> float:
        """Seconds until the window has room again."""
        t = time.monotonic() if now is None else now
        return max(0.0, HOUR_S - (t - self._times[0])) if self._times else 0.0


class RequestGate:
    """One rank's gate (see the module docstring). Not thread-safe: the agent's thread uses it."""

    def __init__(
        self, run_dir: str | os.PathLike[str], limits: CaptureLimits, rank: Callable[[], int]
    ) -> None:
        self.run_dir = run_dir
        self.limits = limits
        self.rank = rank
        self.uid = os.geteuid() if hasattr(os, "geteuid") else -1
        """The job's user (the rank's effective user id; -1 where there is none)."""
        self.captures = RateWindow(limits.max_per_hour)
        self.stacks = RateWindow(limits.stacks_per_hour)
        self.refused = 0
        """Requests refused by this rank."""
        self.failures = 0
        """Refusals that could not be written."""
        self._seen: set[str] = set()
        self._hostname = socket.gethostname()

    def new_requests(self, posted: list[PostedRequest], now_ns: int) -> list[Request]:
        """The requests among ``posted`` seen for the first time that pass the gate, oldest
        first; each refused one is said once (:meth:`refuse`)."""
        self._seen &= {p.name for p in posted}  # (a file withdrawn is forgotten)
        out: list[Request] = []
        for p in posted:
            if p.name in self._seen:
                continue
            self._seen.add(p.name)
            why = self.why_not(p, now_ns)
            if why:
                self.refuse(p.name, why)
            elif p.request is not None:
                out.append(p.request)
        return sorted(out, key=lambda r: r.requested_ns)

    def why_not(self, p: PostedRequest, now_ns: int) -> str:
        """Why the rank does not take ``p``, in words ("" when it does)."""
        if p.request is None:
            return p.problem or f"not a {p.kind} request"
        if not self.limits.any_user and self.uid >= 0 and p.owner >= 0 and p.owner != self.uid:
            return (
                f"written by user {_user(p.owner)}, not by the job's user {_user(self.uid)}: "
                "the ranks take requests of their own user only (meshprof run "
                "--requests-from-any-user takes anyone's)"
            )
        req = p.request
        if req.requested_ns > now_ns + int(FUTURE_S * 1e9):
            ahead = (req.requested_ns - now_ns) / 1e9
            return f"requested {ahead:,.0f} s in the future of this rank's clock"
        if isinstance(req, CaptureRequest):
            excess = self.limits.excess(req)
            if excess:
                return f"over the job's limits: {excess}"
        return ""

    def refuse(self, name: str, reason: str) -> None:
        """Say once why the request file ``name`` is refused (never raises)."""
        self.refused += 1
        try:
            write_refusal(
                self.run_dir,
                RequestRefusal(
                    request=name,
                    reason=reason,
                    rank=self.rank(),
                    refused_ns=time.time_ns(),
                    pid=os.getpid(),
                    hostname=self._hostname,
                ),
            )
        except Exception:
            self.failures += 1


__all__ = ["FUTURE_S", "RateWindow", "RequestGate"]
