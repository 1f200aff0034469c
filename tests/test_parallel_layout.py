"""ParallelConfig validation, RankMapping, dimension_of and `meshprof plan` (no processes
except the CLI subprocesses)."""

from __future__ import annotations

import json

import pytest

from meshprof.errors import MeshprofError
from meshprof.layout import dimension_of
from meshprof.parallel.mapping import (
    RankMapping,
    all_groups,
    coords_of,
    rank_of,
)
from meshprof.parallel.parallel_config import ParallelConfig


def test_rank_mapping_examples_from_the_issue():
    cfg = ParallelConfig(dp=2, tp=2, pp=2)
    assert RankMapping(cfg, 3).coords.as_tuple() == (0, 1, 1)
    assert RankMapping(cfg, 5).coords.as_tuple() == (1, 0, 1)
    assert RankMapping(cfg, 7).coords.as_tuple() == (1, 1, 1)
    m = RankMapping(cfg, 5)
    assert m.dp_group == (1, 5)
    assert m.tp_group == (5, 7)
    assert m.pp_group == (4, 5)
    assert m.prev_pp_rank == 4 and m.next_pp_rank is None
    assert RankMapping(cfg, 4).prev_pp_rank is None and RankMapping(cfg, 4).next_pp_rank == 5


@pytest.mark.parametrize("dp,tp,pp", [(1, 1, 1), (2, 1, 2), (3, 2, 4), (2, 4, 1), (1, 1, 8)])
def test_mapping_is_a_bijection_and_groups_partition_the_world(dp, tp, pp):
    cfg = ParallelConfig(dp=dp, tp=tp, pp=pp, num_layers=8, num_microbatches=8)
    seen = set()
    for r in range(cfg.world_size):
        c = coords_of(cfg, r)
        # the formula from the issue, written out independently
        assert r == c.dp_rank * tp * pp + c.tp_rank * pp + c.pp_rank
        assert rank_of(cfg, *c.as_tuple()) == r
        seen.add(c.as_tuple())
        m = RankMapping(cfg, r)
        for name, size in (("dp", dp), ("tp", tp), ("pp", pp)):
            group = m.groups()[name]
            assert len(group) == size and r in group
    assert len(seen) == cfg.world_size
    for name in ("dp", "tp", "pp"):
        groups = all_groups(cfg, name)
        assert sorted(r for g in groups for r in g) == list(range(cfg.world_size))


def test_dimension_of_group():
    cfg = ParallelConfig(dp=2, tp=2, pp=2)
    m = RankMapping(cfg, 0)
    assert dimension_of([1, 5], m) == "dp"
    assert dimension_of([5, 7], m) == "tp"
    assert dimension_of([6, 7], m) == "pp"
    assert dimension_of(range(8), m) == "world"
    assert dimension_of([0, 3], m) == "tp+pp"
    assert dimension_of([2], m) == "other"
    # only one dimension > 1: the world group is that dimension's group
    assert dimension_of([0, 1, 2, 3], ParallelConfig(dp=4)) == "dp"


@pytest.mark.parametrize(
    "kwargs,world,words",
    [
        (dict(dp=2, tp=2, pp=2), 6, ["2×2×2", "8", "6"]),
        (dict(pp=4, num_layers=6), None, ["num_layers=6", "pp=4"]),
        (
            dict(pp=2, num_layers=6, schedule="interleaved_1f1b", virtual_stages=2),
            None,
            ["num_layers=6", "2×2 = 4"],
        ),
        (dict(pp=4, num_microbatches=2, num_layers=8), None, ["num_microbatches", "2", "pp=4"]),
        (dict(pp=2, schedule="interleaved_1f1b", virtual_stages=1), None, ["virtual_stages"]),
        (
            dict(pp=2, schedule="zbv_zero_bubble", virtual_stages=3, num_layers=12),
            None,
            ["virtual_stages=2"],
        ),
        (dict(dp=2, grad_compression="powersgd"), None, ["powersgd", "ddp"]),
    ],
)
def test_validate_names_the_field_and_numbers(kwargs, world, words):
    with pytest.raises(MeshprofError) as e:
        ParallelConfig(**kwargs).validate(world)
    for w in words:
        assert w in str(e.value)


def test_validate_tp_must_divide_heads_and_hidden():
    with pytest.raises(MeshprofError, match=r"tp=3 does not divide the attention heads \(4\)"):
        ParallelConfig(tp=3).validate(n_heads=4, hidden=96)
    with pytest.raises(MeshprofError, match=r"tp=4 does not divide the hidden size \(66\)"):
        ParallelConfig(tp=4).validate(n_heads=8, hidden=66)
    with pytest.raises(MeshprofError, match="dp=0"):
        ParallelConfig(dp=0)
    with pytest.raises(MeshprofError, match="schedule='bogus'"):
        ParallelConfig(schedule="bogus")
    assert ParallelConfig(dp=2, tp=2, pp=2).validate(8, n_heads=4, hidden=64) is not None


def test_plan_cli_json_and_errors(cli):
    p = cli("plan", "--dp", "2", "--tp", "2", "--pp", "2", "--layers", "24", "--json")
    assert p.returncode == 0
    doc = json.loads(p.stdout)
    assert [r["rank"] for r in doc["ranks"]] == list(range(8))
    assert (doc["ranks"][5]["dp_rank"], doc["ranks"][5]["tp_rank"], doc["ranks"][5]["pp_rank"]) == (
        1,
        0,
        1,
    )
    assert doc["ranks"][1]["layers"] == list(range(12, 24))
    assert doc["groups"]["tp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    strategies = {b["strategy"]: b["total_bytes"] for b in doc["memory"]["by_strategy"]}
    assert (
        strategies["extreme"]
        < strategies["aggressive"]
        < strategies["standard"]
        < strategies["basic"]
    )
    for bad in (
        ["--pp", "5", "--layers", "24"],
        ["--tp", "3", "--layers", "24"],
        ["--pp", "4", "--microbatches", "2"],
        ["--dp", "2", "--world-size", "4"],
    ):
        out = cli("plan", *bad)
        assert out.returncode == 2, bad
        assert (
            out.stdout == "" and len(out.stderr.strip().splitlines()) == 1 and "error" in out.stderr
        )


def test_plan_command_line_text_output(cli):
    p = cli.process("plan", "--dp", "2", "--pp", "2", "--layers", "8")
    assert p.returncode == 0, p.stderr
    assert "process groups" in p.stdout and "memory per device" in p.stdout and "[0,2]" in p.stdout
