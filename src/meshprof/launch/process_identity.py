"""A process told apart from a later one that reuses its PID: its PID and its start time.

Used where one process watches another that may have ended: a worker watching its launcher
(:func:`meshprof.launch.bootstrap.watch_launcher`), a launcher removing the private folders of
launchers that are gone (:mod:`meshprof.launch.private_dir`)."""

from __future__ import annotations


def start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, as psutil reads it), or None when
    there is no such process."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def still_running(pid: int, started: float | None) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``started`` (within 1 s;
    None: any process with that PID)."""
    now = start_time(pid)
    return now is not None and (started is None or abs(now - started) < 1.0)


__all__ = ["start_time", "still_running"]
