"""The launcher's alert watcher: a daemon thread that reads the run's live snapshot every
``poll_s`` seconds, evaluates the rules (:class:`~meshprof.analyze.live.alerts.AlertRules`) and, for each
alert, prints one line on stderr, appends it to ``RUN_DIR/live/alerts.jsonl`` (``meshprof top``
and ``serve`` show it) and runs the user's ``--alert-cmd`` with the alert as JSON on stdin.

The command runs in a shell on its own thread (never blocking the watcher or the launcher), at
most once per (rule, rank) per ``command_interval_s`` seconds — an alert runs it unless every
rank it names had one for its rule that recently, so one rule's or rank's noise never mutes
another's alert — and is killed after
``command_timeout_s``; a failure is one warning on stderr. The watcher never raises: a look that
fails is counted and reported once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from meshprof.analyze.live.alert_config import AlertConfig
from meshprof.analyze.live.alerts import AlertRules
from meshprof.analyze.live.snapshot import read_snapshot
from meshprof.live.say import say
from meshprof.records.live import Alert, LiveSnapshot
from meshprof.rundir.live import append_alert

if TYPE_CHECKING:
    from meshprof.live.capture_trigger import CaptureTrigger

#: Seconds :meth:`AlertWatcher.stop` waits for commands still running.
STOP_WAIT_S = 5.0


class AlertWatcher:
    """Watches ``run_dir``'s live state and raises alerts (see the module docstring)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        config: AlertConfig | None = None,
        stream: TextIO | None = None,
        capture: CaptureTrigger | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.capture = capture
        """Captures on the alerts ``--capture-on`` names (None: none); the alert's command then
        runs once the capture is analysed, with it as ``capture``."""
        self.config = config if config is not None else AlertConfig()
        self.rules = AlertRules(self.config)
        self.stream = stream
        """Where alert lines and warnings go (None: the current ``sys.stderr``)."""
        self.raised: list[Alert] = []
        self.commands_run = 0
        self.commands_skipped = 0
        """Commands not run because every rank the alert names had one for its rule less than
        ``command_interval_s`` ago."""
        self.command_failures = 0
        self.look_failures = 0
        self._last_command: dict[tuple[str, int], float] = {}
        """Monotonic time of the last command per (rule, rank)."""
        self._last_snap: LiveSnapshot | None = None
        self._commands: list[threading.Thread] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AlertWatcher:
        self._thread = threading.Thread(target=self._run, name="meshprof-alerts", daemon=True)
        self._thread.start()
        return self

    def stop(self, died: dict[int, str] | None = None) -> None:
        """Stop looking; raise the job-wide alerts still held and a ``stale`` alert for the
        ranks in ``died`` (rank -> how, as torchrun saw it) that ended without their last
        record (:meth:`AlertRules.flush`); wait (up to :data:`STOP_WAIT_S`) for the commands
        still running."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.poll_s + 5.0)
        if self._thread is None or not self._thread.is_alive():
            snap = self._last_snap
            with contextlib.suppress(Exception):
                if (self.run_dir / "live").is_dir():
                    snap = read_snapshot(self.run_dir)
            for a in self.rules.flush(time.time_ns(), snap, died):
                self.emit(a)
        deadline = time.monotonic() + STOP_WAIT_S
        for t in list(self._commands):
            t.join(timeout=max(deadline - time.monotonic(), 0.0))

    def _run(self) -> None:
        while not self._stop.wait(self.config.poll_s):
            self.look()

    def look(self, now_ns: int | None = None) -> list[Alert]:
        """One look: read the snapshot, evaluate the rules, emit the new alerts (returned)."""
        try:
            live = self.run_dir / "live"
            if not live.is_dir():
                return []
            snap = read_snapshot(self.run_dir, now_ns)
            self._last_snap = snap
            alerts = self.rules.evaluate(snap)
            for a in alerts:
                self.emit(a, snap)
            return alerts
        except Exception as e:
            self.look_failures += 1
            if self.look_failures == 1:
                self._say(f"meshprof run: warning: alert watcher: {type(e).__name__}: {e}")
            return []

    def emit(self, alert: Alert, snap: LiveSnapshot | None = None) -> None:
        """Print, append to alerts.jsonl, capture (``--capture-on``), run the command
        (rate-limited per (rule, rank); after the capture, with it)."""
        self.raised.append(alert)
        self._say(f"meshprof alert: {alert.message}")
        try:
            append_alert(self.run_dir, alert)
        except OSError as e:
            self._say(f"meshprof run: warning: cannot append to the alerts file: {e}")
        cmd = self.config.command
        if cmd:
            now = time.monotonic()
            keys = [(str(alert.kind), r) for r in alert.ranks] or [(str(alert.kind), -1)]
            recent = [
                k
                for k in keys
                if k in self._last_command
                and now - self._last_command[k] < self.config.command_interval_s
            ]
            if len(recent) == len(keys):
                self.commands_skipped += 1
                cmd = None
            else:
                for k in keys:
                    self._last_command[k] = now
                self.commands_run += 1
        capture = self.capture is not None and snap is not None and self.capture.wants(alert)
        if not cmd and not capture:
            return
        t = threading.Thread(
            target=self._capture_then_command if capture else self._run_command,
            args=(cmd, alert, snap) if capture else (cmd, alert),
            name="meshprof-alert-cmd",
            daemon=True,
        )
        self._commands = [c for c in self._commands if c.is_alive()] + [t]
        t.start()

    def _capture_then_command(self, cmd: str | None, alert: Alert, snap: LiveSnapshot) -> None:
        assert self.capture is not None
        try:
            cap = self.capture.capture(alert, snap)
        except Exception as e:
            self._say(f"meshprof run: warning: capture for the {alert.kind} alert failed: {e}")
            return
        self._say(f"meshprof capture: {cap.message}")
        if cmd:
            self._run_command(cmd, alert, cap.to_dict())

    def _run_command(self, cmd: str, alert: Alert, capture: Any = None) -> None:
        payload = {**alert.to_dict(), "run_dir": str(self.run_dir), "capture": capture}
        env = {
            **os.environ,
            "MESHPROF_ALERT_KIND": alert.kind,
            "MESHPROF_ALERT_MESSAGE": alert.message,
            "MESHPROF_RUN_DIR": str(self.run_dir),
        }
        try:
            proc = subprocess.Popen(
                cmd,
                shell=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,  # the launcher's Ctrl-C is not the command's
            )
        except OSError as e:
            self._fail(alert, f"cannot start it: {e}")
            return
        try:
            _, err = proc.communicate(
                (json.dumps(payload) + "\n").encode(), timeout=self.config.command_timeout_s
            )
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            self._fail(alert, f"still running after {self.config.command_timeout_s:g} s, killed")
            return
        except OSError as e:
            _kill_group(proc)
            proc.wait()
            self._fail(alert, str(e))
            return
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
            self._fail(alert, f"exit code {proc.returncode}" + (f": {tail[0]}" if tail else ""))

    def _fail(self, alert: Alert, why: str) -> None:
        self.command_failures += 1
        self._say(f"meshprof run: warning: --alert-cmd for the {alert.kind} alert failed ({why})")

    def _say(self, line: str) -> None:
        say(line, self.stream)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the command and whatever its shell started (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()


__all__ = ["AlertWatcher"]
