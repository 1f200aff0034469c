"""The demo job: one rank of the 3D-parallel transformer, trained under the recorder.

:func:`demo_worker` is what ``meshprof demo`` runs on every rank (through
:func:`meshprof.launch.spawn.run_ranks`); it returns a picklable dict with the rank's losses and
what the recorder saw, split by parallel dimension.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.layout import dimension_of
from meshprof.parallel.model_config import ModelConfig
from meshprof.parallel.parallel_config import ParallelConfig, require_positive_ints

DTYPES = ("float32", "float64", "bfloat16")


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Everything the demo job needs besides the rank."""

    parallel: ParallelConfig = field(default_factory=lambda: ParallelConfig(dp=2, pp=2))
    """The layout (its world size is the number of ranks started)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The transformer's sizes."""
    steps: int = 12
    """Optimizer steps to run."""
    seed: int = 0
    """Seed of the weights and the synthetic tokens."""
    lr: float = 1e-2
    """AdamW learning rate."""
    dtype: str = "float32"
    """Parameter dtype: float32, float64 or bfloat16."""
    device: str = "cpu"
    """"cpu" (gloo) or "cuda" (NCCL, one GPU per rank)."""

    def __post_init__(self) -> None:
        require_positive_ints(self, ("steps",))
        if not self.lr > 0:
            raise MeshprofError(f"lr={self.lr!r} must be positive")
        if self.dtype not in DTYPES:
            raise MeshprofError(f"dtype={self.dtype!r} is not one of: {', '.join(DTYPES)}")
        if self.device not in ("cpu", "cuda"):
            raise MeshprofError(f"device={self.device!r} must be cpu or cuda")
        m = self.model
        self.parallel.validate(n_heads=m.n_heads, hidden=m.d_model, ffn_hidden=m.ffn_hidden)

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


def dimension_totals(events: list[Any], config: ParallelConfig) -> dict[str, dict[str, int]]:
    """Per parallel dimension (:func:`meshprof.layout.dimension_of` labels; dp, tp, pp and other always
    present): collectives, bytes (input side) and summed duration in ns."""
    out = {d: {"count": 0, "bytes": 0, "time_ns": 0} for d in ("dp", "tp", "pp", "other")}
    for ev in events:
        dim = dimension_of(ev.group_ranks or (ev.rank,), config)
        row = out.setdefault(dim, {"count": 0, "bytes": 0, "time_ns": 0})
        row["count"] += 1
        row["bytes"] += max(int(ev.in_bytes), int(ev.out_bytes))
        row["time_ns"] += max(int(ev.duration_ns), 0)  # (-1: still in flight at the read)
    return out


def demo_worker(rank: int, world_size: int, cfg: DemoConfig, out_dir: str) -> dict[str, Any]:
    """Train the demo model as ``rank`` of ``world_size`` (torch.distributed already initialized)
    in a :class:`~meshprof.session.recording.RecordingSession` writing the rank file to ``out_dir``; also
    export the rank's recorder JSON there and return a summary."""
    import torch

    from meshprof.api import StepMonitor, get_profiler
    from meshprof.demo.build import build_job
    from meshprof.demo.train import train
    from meshprof.session.recording import RecordingSession, SessionConfig

    if cfg.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device: Any = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    par = cfg.parallel
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # recorder and rank writer; the group exists, so start() exchanges timestamps (for the
    # report's clock alignment) before any recorded work. The step monitor comes after the build.
    session = RecordingSession(
        SessionConfig(
            run_dir=out,
            rank=rank,
            flush_interval_s=0,
            monitor=False,
            layout={"dp": par.dp, "tp": par.tp, "pp": par.pp},
        )
    ).start()
    prof = get_profiler()
    if session.prof is None or prof is None:
        raise MeshprofError(f"rank {rank}: the recorder did not start: {session.failures}")
    t0 = time.perf_counter()
    job = build_job(
        cfg.parallel,
        cfg.model,
        seed=cfg.seed,
        dtype=getattr(torch, cfg.dtype),
        device=device,
        lr=cfg.lr,
    )
    build_s = time.perf_counter() - t0
    prof.flush()
    first_train_event = prof.log.total
    tokens_per_step = par.dp * par.micro_batch_size * par.num_microbatches * cfg.model.seq_len
    # parameters of this rank's pipeline stage(s) (DTensor numel is the global size), split by TP
    n_params = sum(p.numel() for c in job.chunks for p in c.parameters()) // max(par.tp, 1)
    mon = StepMonitor(
        par,
        profiler=prof,
        rank=rank,
        schedule=str(getattr(par.schedule, "value", par.schedule)),
        microbatches=par.num_microbatches,
        virtual_stages=par.virtual_stages,
        # the usual 6·N·T estimate (forward 2·N·T, backward 4·N·T) over this rank's parameters
        flops_per_step=6.0 * n_params * tokens_per_step / max(par.dp, 1),
        warmup_steps=1,
    )
    session.attach_monitor(mon)
    t1 = time.perf_counter()
    losses = train(job, cfg.steps, seed=cfg.seed, monitor=mon)
    train_s = time.perf_counter() - t1
    prof.flush()
    events = prof.events(first_train_event)
    prof.export_json(out / f"comm_rank{rank:05d}.json")
    session.stop()  # the rank file's last write
    return {
        "rank": rank,
        "coords": job.mapping.coords.as_tuple(),
        "losses": losses,
        "build_s": build_s,
        "train_s": train_s,
        "train_collectives": len(events),
        "dimensions": dimension_totals(events, cfg.parallel),
        "summary": prof.summary(first_train_event, layout=cfg.parallel) if rank == 0 else "",
        "analysis": mon.report() if rank == 0 else "",
    }


__all__ = ["DTYPES", "DemoConfig", "demo_worker", "dimension_totals"]
