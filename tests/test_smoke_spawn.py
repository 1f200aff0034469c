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

    wanted = ("meshprof.comm.recorder", "torch.distributed", "torch.distributed.pipelining")
    return all(name in sys.modules for name in wanted)


def test_ranks_start_with_torch_and_the_recorder_imported():
    """The fork server imported torch, meshprof's recorder and torch's parallel modules, so a
    rank does not import them again (0.2 CPU s a rank for the recorder, ~1 s for what DDP or
    pipelining pull in; this module imports none of them)."""
    assert run_ranks(_preloaded, 2, timeout=60, parallel=True) == [True, True]


def test_ranks_that_only_call_collectives_do_not_preload_the_parallel_modules():
    """``meshprof doctor`` and ``bench`` fork ranks that build no model: their fork server
    does not pay the parallel modules' second; the demo's and the serving demo's do."""
    from meshprof.launch.spawn import PARALLEL, PRELOAD, preload_modules

    assert preload_modules(False) == list(PRELOAD) and PARALLEL not in PRELOAD
    assert preload_modules(True) == [*PRELOAD, PARALLEL]


def test_the_preload_skips_a_module_that_fails(tmp_path, monkeypatch):
    """A parallel module whose import fails for any reason (not only ImportError, which the fork
    server would skip itself) is left out, and the fork server still starts."""
    from meshprof.launch import preload

    (tmp_path / "meshprof_broken_mod.py").write_text("raise RuntimeError('broken install')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(preload, "PARALLEL", ("meshprof_broken_mod", "json", "no_such_mod_x"))
    assert preload.preload() == ("json",)
