"""FLOPs per step, achieved TFLOP/s and MFU.

FLOPs are counted once with ``torch.utils.flop_counter.FlopCounterMode`` (or given by the user).
MFU = achieved FLOP/s / peak FLOP/s of the device. Peaks are dense BF16/FP16 tensor-core figures
from the vendors' datasheets (no sparsity); on CPUs the user sets the peak.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: Dense BF16 (FP16 for V100/T4) tensor-core peak, TFLOP/s, keyed by a substring of the device name.
PEAK_TFLOPS: dict[str, float] = {
    "B200": 2250.0,
    "H200": 989.4,
    "H100 SXM": 989.4,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "H100": 989.4,
    "H800": 989.4,
    "GH200": 989.4,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "A10G": 70.0,
    "A10": 125.0,
    "V100": 125.0,
    "T4": 65.0,
    "MI300X": 1307.4,
    "MI250X": 383.0,
}


def peak_tflops_for(device_name: str) -> float | None:
    """Peak TFLOP/s for a device name such as "NVIDIA H100 80GB HBM3" (longest match wins)."""
    best: tuple[int, float] | None = None
    for key, value in PEAK_TFLOPS.items():
        if key.lower() in device_name.lower() and (best is None or len(key) > best[0]):
            best = (len(key), value)
    return best[1] if best else None


def detect_peak_tflops() -> float | None:
    """The peak of this process's device: env MESHPROF_PEAK_TFLOPS, else the CUDA device's entry
    in :data:`PEAK_TFLOPS`, else None (CPU: set it yourself)."""
    env = os.environ.get("MESHPROF_PEAK_TFLOPS")
    if env:
        try:
            return float(env)
        except ValueError:
            return None
    try:
        import torch

        if torch.cuda.is_available():
            return peak_tflops_for(torch.cuda.get_device_name())
    except Exception:
        return None
    return None


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """Run ``fn(*args, **kwargs)`` once under FlopCounterMode; return (total FLOPs, fn's result).

    Counts forward and, if ``fn`` runs it, backward FLOPs (matmuls, convolutions, attention) as
    PyTorch's flop counter defines them (2 FLOPs per multiply-accumulate).
    """
    from torch.utils.flop_counter import FlopCounterMode

    mode = FlopCounterMode(display=False)
    with mode:
        out = fn(*args, **kwargs)
    return int(mode.get_total_flops()), out


def mfu(
    flops_per_step: float, step_time_s: float, peak_tflops: float | None
) -> tuple[float, float | None]:
    """(achieved TFLOP/s, MFU in [0, 1] or None without a peak)."""
    if step_time_s <= 0:
        return 0.0, None
    achieved = flops_per_step / step_time_s / 1e12
    return achieved, (achieved / peak_tflops if peak_tflops else None)
