"""Real counterfactuals: small gloo jobs (DDP, FSDP2, DTensor TP, torch.distributed.pipelining
GPipe and 1F1B; the demo's model and builder) trained twice in one process group — without,
then with a ``time.sleep`` in one rank's forward — each variant written as its own run
directory (the recorder's events, step spans timed with ``time.time_ns``, a timestamp
exchange), so that the what-if's saving for the sleeping rank can be set against the measured
step-time difference of the two variants.

Imported by tests as ``from data.counterfactual_jobs import ...`` (tests/ is on sys.path)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

KINDS = {
    # kind: (dp, tp, pp, dp_mode, schedule, microbatches)
    "ddp": (4, 1, 1, "ddp", "1f1b", 1),
    "fsdp": (4, 1, 1, "fsdp", "1f1b", 1),
    "tp": (1, 4, 1, "fsdp", "1f1b", 1),
    "gpipe": (2, 1, 2, "fsdp", "gpipe", 2),
    "1f1b": (2, 1, 2, "fsdp", "1f1b", 2),
}
SPAN_NAMES = ["data", "forward", "backward", "forward_backward", "optimizer", "step"]


class _Spans:
    """A step monitor for :func:`meshprof.demo.train.train`: step and phase spans on this
    rank's wall clock, and the recorder's step number."""

    def __init__(self, prof: Any, first_step: int) -> None:
        self.prof, self.step_no, self.rows = prof, first_step, []

    @contextlib.contextmanager
    def step(self, *, tokens: int, samples: int) -> Iterator[None]:
        self.prof.step = self.step_no
        t0 = time.time_ns()
        yield
        t1 = time.time_ns()
        self.rows.append((0, 0, 0, SPAN_NAMES.index("step"), self.step_no, t0, t1 - t0, tokens,
                          samples))  # fmt: skip
        self.step_no += 1

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.time_ns()
        yield
        self.rows.append((1, 0, 1, SPAN_NAMES.index(name), self.step_no, t0, time.time_ns() - t0,
                          0, 0))  # fmt: skip


def counterfactual_worker(
    rank: int, world: int, out: str, kinds: list[str], slow_rank: int, sleep_s: float, steps: int
) -> dict[str, Any]:
    """For each kind: build the job, train ``steps`` steps, then ``steps`` more with rank
    ``slow_rank`` sleeping ``sleep_s`` a step (split over the forwards of its model chunk, one
    per microbatch); write ``out/KIND/fast`` and ``out/KIND/slow``."""
    import torch

    import meshprof
    from data.meshprof_synth import memory_array, spans_array
    from meshprof.comm.clocksync import exchange_timestamps
    from meshprof.demo.build import build_job
    from meshprof.demo.train import train
    from meshprof.parallel.model_config import ModelConfig
    from meshprof.parallel.parallel_config import ParallelConfig
    from meshprof.rundir import Manifest, RankData, RankMeta, write_manifest, write_rank_file

    torch.set_num_threads(1)
    prof = meshprof.enable()
    sync = exchange_timestamps(rounds=20)
    done: dict[str, Any] = {}
    step0 = 0
    for kind in kinds:
        dp, tp, pp, mode, schedule, m = KINDS[kind]
        par = ParallelConfig(dp=dp, tp=tp, pp=pp, num_layers=2, micro_batch_size=2,
                             num_microbatches=m, dp_mode=mode, schedule=schedule)  # fmt: skip
        job = build_job(par, ModelConfig(d_model=32, n_heads=4, vocab_size=64, seq_len=16))
        sleeping = {"on": False}

        def nap(*_: Any, sleeping: dict[str, bool] = sleeping, nap_s: float = sleep_s / m) -> None:
            if sleeping["on"]:
                time.sleep(nap_s)

        if rank == slow_rank:
            job.chunks[0].register_forward_pre_hook(nap)
        for variant in ("fast", "slow"):
            sleeping["on"] = variant == "slow"
            prof.flush()
            first_event = prof.log.total
            spans = _Spans(prof, step0)
            train(job, steps, monitor=spans)
            prof.flush()
            cols, ids = prof.columns()
            ev = cols[ids >= first_event].copy()
            ev["step"] -= step0
            rows = [(*r[:4], r[4] - step0, *r[5:]) for r in spans.rows]
            step0 = spans.step_no
            path = Path(out) / kind / variant
            path.mkdir(parents=True, exist_ok=True)
            meta = RankMeta(
                rank=rank,
                world_size=world,
                hostname=socket.gethostname(),
                groups=[
                    {"name": g.name, "desc": g.desc, "ranks": list(g.ranks), "backend": g.backend}
                    for g in prof.log.groups
                ],
                dtypes=list(prof.log.dtypes),
                labels=list(prof.log.labels),
                span_names=SPAN_NAMES,
                layout={"dp": dp, "tp": tp, "pp": pp},
                clock_sync=sync,
            )
            write_rank_file(path, RankData(rank, ev, spans_array(rows), memory_array([]), meta))
            if rank == 0:
                write_manifest(path, Manifest(world_size=world, command=json.dumps([kind, variant]),
                                              layout={"dp": dp, "tp": tp, "pp": pp}))  # fmt: skip
        done[kind] = len(spans.rows)
        del job
    return done


def measured_saving_ns(fast: Path, slow: Path) -> float:
    """The measured step-time difference (ns): the median over steps (the first left out) of
    the job's step time — the end of a step's last rank minus that of the step before, the
    ranks' clocks being one machine's — slow minus fast."""
    from meshprof.rundir import load_run

    def step_times(d: Path) -> np.ndarray:
        run = load_run(d)
        ends = []
        for r in sorted(run.ranks):
            sp = run.ranks[r].spans
            st = sp[sp["kind"] == 0]
            st = st[np.argsort(st["step"])]
            ends.append(st["start_ns"].astype(np.int64) + st["duration_ns"].astype(np.int64))
        job_end = np.max(np.asarray(ends), axis=0)
        return np.diff(job_end).astype(np.float64)

    return float(np.median(step_times(slow)) - np.median(step_times(fast)))
