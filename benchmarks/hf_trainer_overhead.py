"""Cost of ``meshprof run`` on a third-party training loop: a Hugging Face ``Trainer``.

    pip install transformers accelerate          # for this benchmark only
    python benchmarks/hf_trainer_overhead.py [--rounds 6] [--steps 60]

A tiny GPT-2 built from a config (2 layers, 128 wide, vocabulary 2,000, 64 tokens; random
tokens, no download) is trained with ``Trainer`` under DDP over gloo on 2 CPU ranks, launched
two ways in every round, in rotated order: ``torchrun`` (plain) and ``meshprof run`` (the
recorder with its default configuration, the step monitor and the rank writer). The figure
is ``Trainer``'s own ``train_runtime`` (the training loop only, not the launch), as the ratio
meshprof / plain per round; the summary gives the median ratio and its spread (min–max).
Also prints the CPU that meshprof's own threads used on rank 0 (``recorder_cpu()``) per step
and per collective. Build the native recorder first (``meshprof build-native``), or the first
rounds measure the build. Prints a table; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def train(steps: int, out: str) -> None:
    """The training script itself (run under torchrun / meshprof run)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, 2000, (n, 64), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = GPT2Config(vocab_size=2000, n_positions=64, n_embd=128, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=8,
            max_steps=steps,
            learning_rate=1e-4,
            logging_steps=max(steps, 1),
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            ddp_backend="gloo",
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        result = Trainer(model=model, args=args, train_dataset=Tokens(steps * 8 * 2)).train()
    if int(os.environ.get("RANK", "0")) == 0:
        kernel, cpu = "", {}
        if "meshprof" in sys.modules:
            import meshprof

            prof = meshprof.get_profiler()
            kernel = prof.backend_name if prof is not None else ""
            cpu = prof.recorder_cpu() if prof is not None else {}
        Path(out).write_text(
            json.dumps(
                {"train_runtime": result.metrics["train_runtime"], "kernel": kernel, "cpu": cpu}
            )
        )


def _launch(variant: str, steps: int, tmp: Path, i: int) -> dict[str, Any]:
    out = tmp / f"{variant}-{i}.json"
    script = [str(Path(__file__).resolve()), "--train", str(steps), "--out", str(out)]
    common = ["--standalone", "--nproc-per-node", "2"]
    if variant == "plain":
        cmd = [sys.executable, "-m", "torch.distributed.run", *common, *script]
    else:
        run_dir = tmp / f"run-{i}"
        cmd = [sys.executable, "-m", "meshprof.cli", "run", "-o", str(run_dir), "--no-summary",
               *common, *script]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"{variant} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--train", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.train is not None:
        train(args.train, args.out)
        return
    import torch
    import transformers

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}; load average {os.getloadavg()[0]:.1f}"
    )
    ratios, plain, prof, kernels, cpu_step, cpu_coll, cpu_s = [], [], [], set(), [], [], []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in range(args.rounds):
            order = ("plain", "meshprof") if i % 2 == 0 else ("meshprof", "plain")
            res = {v: _launch(v, args.steps, tmp, i) for v in order}
            plain.append(res["plain"]["train_runtime"])
            prof.append(res["meshprof"]["train_runtime"])
            kernels.add(res["meshprof"]["kernel"])
            cpu = res["meshprof"].get("cpu") or {}
            if cpu.get("total_ns") is not None:
                cpu_step.append(cpu["total_ns"] / 1e6 / args.steps)
                cpu_coll.append((cpu.get("per_collective_ns") or 0.0) / 1e3)
                cpu_s.append(cpu.get("per_second_ms") or 0.0)
            ratios.append(prof[-1] / plain[-1])
            print(f"round {i}: plain {plain[-1]:.2f} s, meshprof {prof[-1]:.2f} s, "
                  f"ratio {ratios[-1]:.3f}", flush=True)  # fmt: skip
    print()
    print("| job | rounds | plain train_runtime (median) | meshprof run | ratio median | min–max |")
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| HF Trainer, tiny GPT-2, DDP gloo × 2, {args.steps} steps | {args.rounds} | "
        f"{statistics.median(plain):.2f} s | {statistics.median(prof):.2f} s | "
        f"{statistics.median(ratios):.3f} | {min(ratios):.3f}–{max(ratios):.3f} |"
    )
    print(f"\nrecorder kernel under meshprof run: {', '.join(sorted(kernels))}")
    if cpu_step:
        print(
            "meshprof's threads on rank 0 (recorder_cpu(): writer, live publisher, pollers), "
            f"median over rounds: {statistics.median(cpu_step):.2f} ms CPU per step, "
            f"{statistics.median(cpu_coll):.1f} µs per collective, "
            f"{statistics.median(cpu_s):.2f} ms per second of the process (setup included)"
        )


if __name__ == "__main__":
    main()
