"""estimate_memory against the measured peak of the demo model.

The oracle is PyTorch's own allocator accounting: with ``torch.profiler(profile_memory=True)``
every CPU allocation and free is an event with its pointer, size and thread. Profiling starts
before the model is built, so the peak of the bytes live during training is everything training
holds: parameters, gradients, AdamW state, saved activations and temporaries. Allocations made on
the backend's own threads are left out (a free of a training tensor counts wherever it happens):
gloo's worker threads allocate scratch buffers for each collective (about 30 MB over two steps of
the dp=2 job), and how many overlap the training peak depends on scheduling; on NCCL such buffers
are not in PyTorch's allocator at all. The estimate must be within 25% of the peak.
"""

from __future__ import annotations

import pytest
import torch

from meshprof.launch.spawn import run_ranks
from meshprof.parallel.memory_estimate import estimate_memory
from meshprof.parallel.model_config import ModelConfig
from meshprof.parallel.parallel_config import ParallelConfig

# activations and parameters of similar size, so neither hides an error in the other
MODEL = ModelConfig(d_model=128, n_heads=4, vocab_size=512, seq_len=128)
TOLERANCE = 0.25


def measure_peak(kwargs: dict, steps: int = 2) -> tuple[int, int]:
    """(measured peak bytes during training, this rank's pp_rank)."""
    import torch._C._profiler as P
    from torch.profiler import ProfilerActivity, profile, record_function

    from meshprof.demo.build import build_job
    from meshprof.demo.train import train

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        job = build_job(ParallelConfig(**kwargs), MODEL, seed=0, dtype=torch.float32)
        with record_function("meshprof_train_starts"):
            pass
        train(job, steps, seed=0)
    allocs: list[tuple[int, int, int, int]] = []  # (time, thread, pointer, signed size)
    mark = [0, -1]

    def walk(events):
        for e in events:
            if isinstance(e.extra_fields, P._ExtraFields_Allocation):
                f = e.extra_fields
                allocs.append((e.start_time_ns, e.start_tid, f.ptr, f.alloc_size))
            elif e.name == "meshprof_train_starts":
                mark[0], mark[1] = e.start_time_ns, e.start_tid
            walk(e.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    assert mark[0] and allocs
    allocs.sort()
    live: dict[int, int] = {}  # pointer -> bytes, for allocations of the training thread
    held = peak = 0
    for t, tid, ptr, size in allocs:
        if size > 0 and tid == mark[1]:
            live[ptr] = size
            held += size
        elif size < 0 and ptr in live:
            held -= live.pop(ptr)
        if t >= mark[0]:
            peak = max(peak, held)
    return peak, job.mapping.pp_rank


def _worker(rank: int, world_size: int, kwargs: dict) -> tuple[int, int]:
    return measure_peak(kwargs)


def _assert_close(kwargs: dict, measured: int, pp_rank: int) -> None:
    est = estimate_memory(
        ParallelConfig(**kwargs), MODEL, param_bytes=4, device_type="cpu"
    ).per_stage[pp_rank]
    ratio = est.total_bytes / measured
    print(
        f"{kwargs} pp_rank {pp_rank}: estimate {est.total_bytes / 2**20:.2f} MiB, measured {measured / 2**20:.2f} MiB, ratio {ratio:.3f}"
    )
    assert abs(ratio - 1) <= TOLERANCE, (kwargs, est, measured)


@pytest.mark.parametrize("strategy", ["standard", "aggressive"])
def test_single_rank_estimate_matches_measured_peak(strategy):
    kwargs = dict(memory_strategy=strategy)
    measured, pp_rank = measure_peak(kwargs)
    _assert_close(kwargs, measured, pp_rank)


@pytest.mark.parametrize("kwargs", [dict(pp=2), dict(dp=2)], ids=["pp2-1f1b", "dp2-fsdp"])
def test_two_rank_estimate_matches_measured_peak_on_every_rank(kwargs):
    for measured, pp_rank in run_ranks(_worker, 2, (kwargs,), timeout=120):
        _assert_close(kwargs, measured, pp_rank)


def test_parameter_count_is_exact_and_strategies_order():
    from meshprof.demo.model import build_model

    cfg = ParallelConfig(num_layers=4)
    est = estimate_memory(cfg, MODEL, param_bytes=4)
    n = sum(p.numel() for p in build_model(MODEL, 4, seed=0).parameters())
    assert est.per_stage[0].params_bytes == 4 * n
    assert est.per_stage[0].optimizer_bytes == 8 * n
    pp = estimate_memory(ParallelConfig(pp=2, num_microbatches=4, schedule="gpipe"), MODEL)
    one = estimate_memory(ParallelConfig(pp=2, num_microbatches=4), MODEL)
    assert (
        pp.per_stage[0].microbatches_in_flight == 4 and one.per_stage[0].microbatches_in_flight == 2
    )
    assert one.per_stage[1].microbatches_in_flight == 1
    ck = est.per_stage[0]
    assert ck.activations_ckpt_bytes < ck.activations_no_ckpt_bytes
