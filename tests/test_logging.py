"""setup_logging: one file per rank with the rank in each record, console from rank 0 only."""

from __future__ import annotations

import logging

from meshprof.launch.spawn import run_ranks
from meshprof.tools.logs import log_file, setup_logging


def _log(rank, ws, d):
    import logging

    import meshprof

    log = meshprof.setup_logging(d)  # rank from the process group
    log.info("hello from the training loop")
    logging.getLogger("meshprof.sub").warning("child logger %d", rank)
    for h in log.handlers:
        h.flush()
    return [type(h).__name__ for h in log.handlers]


def test_per_rank_files(tmp_path):
    handlers = run_ranks(_log, 2, args=(str(tmp_path),), timeout=60)
    assert handlers[0] == ["RotatingFileHandler", "StreamHandler"]
    assert handlers[1] == ["RotatingFileHandler"]  # no console output from rank 1
    for r in (0, 1):
        lines = log_file(tmp_path, r).read_text().splitlines()
        assert len(lines) == 2
        assert all(f"[rank {r}]" in s for s in lines)
        assert lines[1].endswith(f"child logger {r}")


def test_rotation_and_no_duplicates(tmp_path, capsys):
    log = setup_logging(tmp_path, rank=3, max_bytes=2000, backup_count=2, logger="meshprof.test")
    log = setup_logging(tmp_path, rank=3, max_bytes=2000, backup_count=2, logger="meshprof.test")
    assert len(log.handlers) == 1  # rank 3: file only; calling twice did not duplicate it
    for i in range(100):
        log.info("line %d %s", i, "x" * 50)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["rank00003.log", "rank00003.log.1", "rank00003.log.2"]
    assert capsys.readouterr().err == ""
    for h in log.handlers:
        h.close()
    logging.getLogger("meshprof.test").handlers.clear()
