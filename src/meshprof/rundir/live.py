"""The live state's files in a run directory: ``RUN_DIR/live/rank{R:05d}.json`` (one
:class:`~meshprof.records.live.RankLive` per rank, replaced by the rank every ``interval_s``)
and ``RUN_DIR/live/alerts.jsonl`` (one :class:`~meshprof.records.live.Alert` per line, appended
by the launcher's alert rules). In the run directory, so a directory shared across nodes works."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

from meshprof.records.codec import RecordError
from meshprof.records.live import Alert, RankLive
from meshprof.rundir.atomic import FILE_MODE, atomic_write_text
from meshprof.rundir.confine import make_dirs
from meshprof.rundir.json_file import TooLargeError, loads, read_json
from meshprof.rundir.segment_tail import read_json_lines

LIVE_DIR = "live"
ALERTS_FILE = "alerts.jsonl"
LIVE_FILE_RE = re.compile(r"^rank(\d+)\.json$")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
MAX_LIVE_BYTES = 4 << 20
"""A live record larger than this (bytes) is not read (a record is a few kB)."""
ALERTS_TAIL_BYTES = 1 << 20
"""The alerts are read from the last this many bytes of ``alerts.jsonl`` (it only grows)."""


def live_dir(run_dir: str | os.PathLike[str]) -> Path:
    """``RUN_DIR/live``."""
    return Path(run_dir) / LIVE_DIR


def live_file(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` publishes its :class:`RankLive`."""
    return live_dir(run_dir) / f"rank{int(rank):05d}.json"


def write_rank_live(run_dir: str | os.PathLike[str], rec: RankLive) -> Path:
    """Publish ``rec`` atomically (a new file renamed into place; :class:`LiveWriter` is the
    cheaper way for a rank that publishes every second)."""
    return atomic_write_text(live_file(run_dir, rec.rank), json.dumps(rec.to_dict()), fsync=False)


class LiveWriter:
    """Rewrites one rank's live file in place (``pwrite`` at offset 0, then truncate), keeping
    the file open.

    Why not a rename per record: on ext4 replacing an existing file by rename forces the new
    data to disk first (``auto_da_alloc``), ~5 ms each time here; an in-place write is ~40 µs.
    A reader that races the write may see a mix of two records, which is not valid JSON:
    :func:`read_rank_lives` reads again."""

    def __init__(
        self, path: str | os.PathLike[str], within: str | os.PathLike[str] | None = None
    ) -> None:
        """``within``: the run directory the file must lie in, every link resolved
        (:class:`~meshprof.rundir.confine.OutsideRunDirError` otherwise)."""
        self.path = Path(path)
        if within is not None:
            make_dirs(within, self.path.parent)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, FILE_MODE)

    def write(self, rec: RankLive) -> Path:
        data = json.dumps(rec.to_dict()).encode("utf-8")
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        return self.path

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _read_record(p: Path, tries: int = 3) -> RankLive | None:
    for i in range(tries):
        try:
            data = read_json(p, MAX_LIVE_BYTES)
            return RankLive.from_dict(data) if isinstance(data, dict) else None
        except TooLargeError:
            return None
        except ValueError:
            if i + 1 < tries:
                time.sleep(0.005)  # raced the writer: read again
        except (OSError, TypeError, RecordError):  # unreadable, or not a live record
            return None
    return None


def read_rank_lives(
    run_dir: str | os.PathLike[str], only: Callable[[int], bool] | None = None
) -> dict[int, RankLive]:
    """Every rank's latest record (files that cannot be read are skipped: a reader may race a
    rank's first write). ``only``: read just the ranks it accepts (by rank number, before the
    file is opened)."""
    out: dict[int, RankLive] = {}
    d = live_dir(run_dir)
    if not d.is_dir():
        return out
    for p in d.iterdir():
        m = LIVE_FILE_RE.match(p.name)
        if not m or (only is not None and not only(int(m.group(1)))):
            continue
        rec = _read_record(p)
        if rec is not None:
            out[int(m.group(1))] = rec
    return dict(sorted(out.items()))


def clear_live(run_dir: str | os.PathLike[str]) -> int:
    """Remove a previous run's live records and alerts from ``run_dir`` (a run directory used
    again); the number of files removed. The launcher calls it before the workers start."""
    d = live_dir(run_dir)
    removed = 0
    if not d.is_dir():
        return 0
    for p in d.iterdir():
        if LIVE_FILE_RE.match(p.name) or p.name == ALERTS_FILE:
            with contextlib.suppress(OSError):
                p.unlink()
                removed += 1
    return removed


def append_alert(run_dir: str | os.PathLike[str], alert: Alert) -> None:
    """Append ``alert`` to ``RUN_DIR/live/alerts.jsonl`` (one short write: lines of several
    writers do not interleave)."""
    path = live_dir(run_dir) / ALERTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(alert.to_dict()) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, FILE_MODE)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_alerts(run_dir: str | os.PathLike[str], last: int = 100) -> list[Alert]:
    """The ``last`` alerts, oldest first (lines that do not parse are skipped)."""
    path = live_dir(run_dir) / ALERTS_FILE
    out: list[Alert] = []
    with contextlib.suppress(OSError):
        for line in _tail(path, ALERTS_TAIL_BYTES).splitlines()[-last:]:
            with contextlib.suppress(ValueError, TypeError, RecordError):
                d = loads(line)
                if isinstance(d, dict):
                    out.append(Alert.from_dict(d))
    return out


def alerts_after(
    run_dir: str | os.PathLike[str], offset: int, max_bytes: int = 1 << 20
) -> tuple[list[Alert], int]:
    """The alerts appended to ``RUN_DIR/live/alerts.jsonl`` after byte ``offset`` (at most
    ``max_bytes`` read; a line not yet ended is left for the next call; lines that are no alert
    are skipped), oldest first, and the offset to read from next."""
    lines, offset = read_json_lines(live_dir(run_dir) / ALERTS_FILE, offset, max_bytes=max_bytes)
    out: list[Alert] = []
    for d in lines:
        try:
            out.append(Alert.from_dict(d))
        except (RecordError, TypeError, ValueError):
            continue
    return out, offset


def _tail(path: Path, nbytes: int) -> str:
    """The last ``nbytes`` of a regular file as text (bytes that are not UTF-8 replaced)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        os.lseek(fd, max(0, st.st_size - nbytes), os.SEEK_SET)
        return os.read(fd, nbytes).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def manifest_done(run: str | os.PathLike[str]) -> bool:
    """The launcher wrote a final status (ok, failed, hang) into the run's manifest."""
    return _manifest_done(Path(run))


def _manifest_done(run: Path) -> bool:
    """The launcher wrote a final status (ok, failed, hang) into the manifest."""
    with contextlib.suppress(OSError, ValueError):
        m = read_json(run / "manifest.json")
        return isinstance(m, dict) and m.get("status") in {"ok", "failed", "hang"}
    return False
