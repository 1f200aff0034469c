"""Stage timelines for torch.distributed.pipelining.

``_PipelineStageBase.forward_one_chunk`` / ``backward_one_chunk`` / ``backward_weight_one_chunk``
are wrapped (once per process) so every micro-batch a stage computes becomes a phase span
("pp_forward", "pp_backward", "pp_backward_weight") of the active StepMonitor. The pipeline
bubble is measured from these spans.
"""

from __future__ import annotations

import functools
from typing import Any

_installed = False
CHUNK_PHASES = {
    "forward_one_chunk": "pp_forward",
    "backward_one_chunk": "pp_backward",
    "backward_weight_one_chunk": "pp_backward_weight",
}
"""Stage method -> the phase name each of its calls is recorded as."""
PIPELINE_CHUNKS = tuple(CHUNK_PHASES.values())
"""Phase names of one micro-batch's forward / backward chunk (what the bubble is made of)."""


def install_pipeline_hooks() -> bool:
    """Wrap the stage methods; returns False when torch has no pipelining module."""
    global _installed
    if _installed:
        return True
    try:
        from torch.distributed.pipelining import stage as stage_mod
    except Exception:
        return False
    base = getattr(stage_mod, "_PipelineStageBase", None)
    if base is None:
        return False
    for method, span in CHUNK_PHASES.items():
        original = getattr(base, method, None)
        if original is None or getattr(original, "__meshprof__", False):
            continue
        setattr(base, method, _wrap(original, span))
    _installed = True
    return True


def _wrap(original: Any, span_name: str) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from meshprof.monitor.monitor import get_monitor

        mon = get_monitor()
        if mon is None:
            return original(*args, **kwargs)
        with mon.phase(span_name):
            return original(*args, **kwargs)

    wrapper.__meshprof__ = True  # type: ignore[attr-defined]
    return wrapper
