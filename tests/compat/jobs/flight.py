"""What the compatibility scripts record of a job, without meshprof: the framework's own figures
and PyTorch's Flight Recorder.

Every script of the compatibility cells imports this module, in the plain torchrun run and in
the ``meshprof run`` one alike, so both runs do the same thing. ``FlightCounter`` reads the
Flight Recorder (``TORCH_FR_BUFFER_SIZE``, set by the test for both runs): gloo puts every
collective it enqueues there (not send/recv), which is the per-step truth meshprof's
collective counts are checked against. ``write_result`` writes a rank's record to
``$COMPAT_OUT/rank<N>.json`` (floats keep their full precision in JSON).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class FlightCounter:
    """The Flight Recorder entries (their ``profiling_name``, e.g. "gloo:all_reduce") added
    since the previous call."""

    def __init__(self) -> None:
        self.last_id = -1

    def since_last(self) -> list[str]:
        import torch

        try:
            raw = torch._C._distributed_c10d._dump_fr_trace_json(True, False)
        except Exception:  # no Flight Recorder in this build or this backend
            return []
        entries = json.loads(raw).get("entries", [])
        new = [e for e in entries if e["record_id"] > self.last_id]
        if new:
            self.last_id = max(e["record_id"] for e in new)
        return [str(e["profiling_name"]) for e in new]


def write_result(record: dict[str, Any]) -> None:
    """This rank's record, as ``$COMPAT_OUT/rank<RANK>.json`` (nothing without COMPAT_OUT)."""
    out = os.environ.get("COMPAT_OUT")
    if not out:
        return
    rank = int(os.environ.get("RANK", "0"))
    Path(out).mkdir(parents=True, exist_ok=True)
    tmp = Path(out, f"rank{rank}.json.tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(Path(out, f"rank{rank}.json"))
