"""meshprof bench on real gloo groups: results are checked, sizes follow nccl-tests, and busbw is
S / t × factor with t an independent timing (the spawn wall clock bounds it from above)."""

from __future__ import annotations

import csv
import json

import pytest

from meshprof.errors import MeshprofError
from meshprof.launch.spawn import run_ranks
from meshprof.tools.bench import ALL_OPS, BenchConfig, parse_size, run_bench_rank, size_list


def test_parse_sizes():
    assert parse_size("1K") == 1024 and parse_size("8M") == 8 << 20 and parse_size("1G") == 1 << 30
    assert parse_size("4096") == 4096 and parse_size("2MiB") == 2 << 20
    assert size_list(1024, 16384, 2) == [1024, 2048, 4096, 8192, 16384]
    with pytest.raises(MeshprofError, match="bad size"):
        parse_size("12X")
    with pytest.raises(MeshprofError, match="-f must be > 1"):
        size_list(1, 8, 1)
    with pytest.raises(MeshprofError, match="unknown op"):
        BenchConfig(ops=("allreduce",))


def _wrong_reduce(rank, ws):
    """A rank that contributes a wrong value: the check must count the wrong elements."""

    from meshprof.tools import bench

    real = bench._pattern

    def bad(torch_, count, dtype, device):
        p = real(torch_, count, dtype, device)
        if rank == 1 and count == 256:
            p[:3] = 100  # 3 poisoned elements of rank 1's input
        return p

    bench._pattern = bad
    cfg = BenchConfig(ops=("all_reduce",), sizes=(1024,), warmup=0, iters=2)
    return run_bench_rank(rank, ws, cfg)


@pytest.mark.timeout(120)
def test_every_op_correct_3_ranks():
    cfg = BenchConfig(ops=ALL_OPS, sizes=(3072, 49152), warmup=1, iters=3)
    res = run_ranks(run_bench_rank, 3, args=(cfg,), timeout=100)[0]
    assert res.world_size == 3 and res.backend == "gloo"
    got = {(r.op, r.mode) for r in res.rows}
    assert ("all_gather", "in-place") in got and ("all_gather", "out-of-place") in got
    assert ("reduce_scatter", "in-place") in got and ("all_reduce", "in-place") in got
    assert len(res.rows) == 11 * 2
    for r in res.rows:
        assert r.wrong == 0, r
        assert r.time_min_us <= r.time_us <= r.time_max_us
        assert r.iter_min_us <= r.iter_p99_us <= r.iter_max_us
        # nccl-tests: algbw = S / t, busbw = algbw × factor
        assert r.algbw == pytest.approx(r.size / (r.time_us * 1e3), rel=1e-3)
    by = {(r.op, r.size): r for r in res.rows}
    assert by[("all_reduce", 3072)].busbw == pytest.approx(
        by[("all_reduce", 3072)].algbw * 4 / 3, rel=1e-9
    )
    assert by[("broadcast", 3072)].busbw == pytest.approx(by[("broadcast", 3072)].algbw)
    ag = next(r for r in res.rows if r.op == "all_gather" and r.size == 3072)
    assert ag.count == 3072 // 4 // 3 and ag.busbw == pytest.approx(ag.algbw * 2 / 3, rel=1e-9)


@pytest.mark.timeout(60)
def test_check_counts_wrong_elements():
    res = run_ranks(_wrong_reduce, 2, timeout=50)[0]
    # 3 wrong inputs on rank 1 make 3 wrong sums on each of the 2 ranks
    assert res.rows[0].wrong == 6


@pytest.mark.timeout(60)
def test_cli_outputs(tmp_path, cli):
    svg, csvp = tmp_path / "bw.svg", tmp_path / "bw.csv"
    p = cli(
        "bench",
        "--nproc",
        "2",
        "--ops",
        "all_reduce,all_gather,send",
        "-b",
        "1K",
        "-e",
        "16K",
        "-f",
        "4",
        "-n",
        "3",
        "-w",
        "1",
        "--json",
        "--csv",
        str(csvp),
        "--plot",
        str(svg),
    )
    assert p.returncode == 0
    data = json.loads(p.stdout)
    rows = data["rows"]
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "sendrecv"}
    assert sorted({r["size"] for r in rows if r["op"] == "all_reduce"}) == [1024, 4096, 16384]
    assert all(r["wrong"] == 0 for r in rows)
    table = list(csv.DictReader(csvp.open()))
    assert len(table) == len(rows) and float(table[0]["busbw"]) >= 0
    text = svg.read_text()
    assert (
        text.startswith("<svg") and text.count("<polyline") == 4
    )  # all_reduce, all_gather ×2 modes, sendrecv
    p = cli("bench", "--nproc", "2", "--ops", "all_reduce", "-b", "1K", "-e", "1K", "-n", "2")
    assert p.returncode == 0
    out = p.stdout
    assert "busbw" in out and "all_reduce" in out and "# total #wrong: 0" in out


def test_cli_bad_input(cli):
    p = cli("bench", "-b", "lots")
    assert p.returncode == 2
    assert "bad size 'lots'" in p.stderr
    p = cli("bench", "--ops", "all_reduce,nope")
    assert p.returncode == 2
    assert "unknown op 'nope'" in p.stderr


def test_backend_needs_a_gpu_per_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL refuses two ranks on one GPU: the default backend is nccl only with a GPU for every
    local rank, and ``--backend nccl`` with fewer GPUs is a one-line error."""
    import argparse

    import torch

    from meshprof.commands.arguments import backend_of
    from meshprof.errors import MeshprofError

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert backend_of(argparse.Namespace(backend=None, nproc=2)) == "gloo"
    assert backend_of(argparse.Namespace(backend=None, nproc=1)) == "nccl"
    assert backend_of(argparse.Namespace(backend="gloo", nproc=4)) == "gloo"
    with pytest.raises(MeshprofError, match="one GPU per local rank: 2 rank"):
        backend_of(argparse.Namespace(backend="nccl", nproc=2))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # under torchrun: the launcher's local ranks
    assert backend_of(argparse.Namespace(backend=None, nproc=None)) == "gloo"
