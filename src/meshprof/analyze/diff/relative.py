"""The relative difference of two runs' figures, one rule for every diff (runs and serving)."""

from __future__ import annotations

import math


def relative(delta: float, a: float) -> float:
    """``delta / a`` (B − A over A, a fraction); NaN when ``a`` is not positive or the difference
    is missing or infinite."""
    return delta / a if a > 0 and math.isfinite(delta) else math.nan


__all__ = ["relative"]
