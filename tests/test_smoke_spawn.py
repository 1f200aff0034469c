import time

from meshprof.launch.spawn import run_ranks


def _ar(rank, ws):
    import torch
    import torch.distributed as dist

    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t)
    return t.tolist()


def test_run_ranks_all_reduce():
    t0 = time.time()
    out = run_ranks(_ar, 2, timeout=60)
    assert out == [[3.0] * 3, [3.0] * 3]
    print("took", time.time() - t0)


def _preloaded(rank, ws):
    import sys

    return "meshprof.comm.recorder" in sys.modules and "torch.distributed" in sys.modules


def test_ranks_start_with_torch_and_the_recorder_imported():
    """The fork server imported torch and meshprof's recorder, so a rank does not import them
    again (0.2 CPU s a rank; this module imports neither)."""
    assert run_ranks(_preloaded, 2, timeout=60) == [True, True]
