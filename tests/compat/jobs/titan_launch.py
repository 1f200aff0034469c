"""torchtitan's own entry point (``torchtitan.train.main``), unmodified, on CPU ranks over gloo.

torchtitan 0.3.0 has no CPU path; this launcher applies, in its own process and before
torchtitan runs, the shims a CPU machine needs (each one changes how torchtitan reaches the
hardware, none what it computes), then calls ``torchtitan.train.main()`` with the command line
it was given:

* the device is "cpu" (``tools/utils.py`` falls back to "cuda" when no accelerator is present);
* the memory monitor reads the process's peak resident set (``VmHWM`` in /proc/self/status): the
  CUDA one calls CUDA-only functions (``components/metrics.py``);
* FlexAttention's compiled kernel (it has no backward on CPU) becomes the dense math equivalent
  of its block mask: the mask evaluated at every (query, key) pair, softmax(QKᵀ·scale + mask)·V;
  the block mask itself is built eagerly (its compiled builder would cost an inductor compile
  per run);
* FSDP reduces with plain SUM (gloo has no PREMUL_SUM; the divide factor is 1, so the result is
  the same);
* ``torch.distributed.set_timeout``, missing in torch 2.13, sets the group's own timeout, and the
  barrier before it gets device index 0 (``torch.cpu.current_device()`` is the string "cpu").

The framework's figures are recorded: a metrics logger of torchtitan's own kind
(``BaseLogger``) receives every dict torchtitan logs (loss, throughput(tps), end-to-end time,
memory) and writes them, with full float precision, to ``$COMPAT_OUT/rank<N>.json`` at exit.

``write_assets(folder)`` writes what the wheel does not ship: a word-level tokenizer
(``tokenizer.json``, ``tokenizer_config.json``) and a small text dataset (``data/train.jsonl``)
of seeded pseudo-random sentences, for ``--hf-assets-path`` and ``--dataloader.dataset-path``.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

from flight import write_result

#: the dataset's vocabulary (its sentences are seeded random picks)
VOCABULARY = """
the a one two red blue green small large old new fast slow cat dog bird fish tree house river
stone cloud rain sun moon star road city field ship train light dark warm cold runs jumps sings
reads writes sees finds holds makes takes gives eats sleeps walks and or but then while over
under near far into from with without before after
"""
WORDS = VOCABULARY.split()
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def write_assets(folder: str | os.PathLike[str], documents: int = 400, seed: int = 0) -> Path:
    """The tokenizer and the dataset torchtitan reads, under ``folder``; returns it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = Path(folder)
    (root / "data").mkdir(parents=True, exist_ok=True)
    vocab = {"<unk>": 0, BOS: 1, EOS: 2}
    for w in [*WORDS, ".", ","]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "add_bos_token": False})
    )
    rng = random.Random(seed)
    with open(root / "data" / "train.jsonl", "w") as f:
        for _ in range(documents):
            words = [rng.choice(WORDS) for _ in range(rng.randint(8, 60))]
            f.write(json.dumps({"text": " ".join(words) + " ."}) + "\n")
    return root


def _vm_hwm_bytes() -> int:
    """The process's peak resident set (the kernel's high-water mark), bytes; -1 unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def _host_ram_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class CpuMemoryMonitor:
    """torchtitan's DeviceMemoryMonitor for a CPU process: peak = the peak resident set."""

    def __init__(self) -> None:
        self.device_name = "cpu"
        self.device_capacity = _host_ram_bytes()
        self.device_capacity_gib = self.device_capacity / 2**30

    def get_peak_stats(self) -> Any:
        from torchtitan.components.metrics import DeviceMemStats

        peak = _vm_hwm_bytes()
        gib, pct = peak / 2**30, 100 * peak / self.device_capacity
        return DeviceMemStats(gib, pct, gib, pct, 0, 0)

    def reset_peak_stats(self) -> None:
        """The kernel's high-water mark is not reset: the figure is the peak since start."""


def dense_flex_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    score_mod: Any = None,
    block_mask: Any = None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_aux: Any = None,
    kernel_options: Any = None,
) -> tuple[Any, Any]:
    """flex_attention's result computed densely: (B, H, L, E) queries, keys and values."""
    import torch
    from torch.nn.attention.flex_attention import AuxOutput, create_mask

    if score_mod is not None:
        raise NotImplementedError("the dense equivalent covers mask_mod only")
    if enable_gqa and k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if block_mask is not None:
        b, _, lq, lk = block_mask.shape
        allowed = create_mask(block_mask.mask_mod, b, 1, lq, lk, device=q.device)
        scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), v)
    want_lse = return_aux is not None and getattr(return_aux, "lse", False)
    return out, AuxOutput(lse=lse if want_lse else None)


def _recording_logger(records: list[dict[str, Any]]) -> Any:
    from flight import FlightCounter
    from torchtitan.components.metrics import BaseLogger

    flight = FlightCounter()

    class RecordingLogger(BaseLogger):
        """Keeps every metrics dict torchtitan logs (torchtitan's own figures), with the
        collectives the Flight Recorder saw since the previous one."""

        def log(self, metrics: dict[str, Any], step: int) -> None:
            row: dict[str, Any] = {"step": step, **{k: float(v) for k, v in metrics.items()}}
            row["flight"] = flight.since_last()
            records.append(row)

    return RecordingLogger()


def apply_cpu_shims(records: list[dict[str, Any]]) -> None:
    """Everything listed in the module docstring, applied before torchtitan builds anything."""
    import torch
    import torch._utils as tu
    import torch.distributed as dist

    get_type = tu._get_available_device_type
    tu._get_available_device_type = lambda: "cpu"  # type: ignore[assignment]
    try:
        import torchtitan.tools.utils  # noqa: F401  (reads the device type once, at import)
    finally:
        tu._get_available_device_type = get_type  # type: ignore[assignment]

    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.fsdp as fsdp
    import torchtitan.models.common.attention as attention
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.attention.flex_attention import create_block_mask

    metrics.build_device_memory_monitor = CpuMemoryMonitor  # type: ignore[assignment]
    metrics.MetricsProcessor._build_metric_logger = (  # type: ignore[method-assign]
        lambda self, **kw: _recording_logger(records)
    )
    attention.FlexAttention._compiled_flex_attn = dense_flex_attention  # type: ignore[assignment]
    attention._compiled_create_block_mask = create_block_mask  # type: ignore[assignment]

    def sum_reduction(model: torch.nn.Module) -> None:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)

    fsdp.disable_fsdp_gradient_division = sum_reduction  # type: ignore[assignment]

    if not hasattr(dist, "set_timeout"):

        def set_timeout(timeout: Any, group: Any = None) -> None:
            pg = group if group is not None else dist.distributed_c10d._get_default_group()
            pg.set_timeout(timeout)

        dist.set_timeout = set_timeout  # type: ignore[attr-defined]

    import torchtitan.distributed.utils as dist_utils

    class CpuDeviceModule:
        """torch.cpu, with the device index torch.distributed.barrier(device_ids=...) takes."""

        def __getattr__(self, name: str) -> Any:
            return getattr(torch.cpu, name)

        @staticmethod
        def current_device() -> int:
            return 0

    dist_utils.device_module = CpuDeviceModule()  # type: ignore[assignment]


def main() -> None:
    records: list[dict[str, Any]] = []
    apply_cpu_shims(records)
    from torchtitan.train import main as titan_main

    sys.argv = [sys.argv[0], *sys.argv[1:]]
    try:
        titan_main()
    finally:
        write_result({"metrics": records})


if __name__ == "__main__":
    main()
