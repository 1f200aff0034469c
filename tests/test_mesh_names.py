"""The layout read from the job itself: DeviceMesh dimension names per process group
(``meshprof.comm.mesh_names``), what they say (``meshprof.layout.dimension_of_names``) and which
source decides a group's dimension (``dimension_of``, ``resolve_layout``).

Oracle for the recorded names: DeviceMesh's own answer, ``mesh.get_group(dim)`` (its group's
name), on real gloo process groups; for the frameworks, the meshes torchtitan and Hugging Face
transformers build themselves.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from meshprof.launch.spawn import run_ranks
from meshprof.layout import Layout, dimension_of, dimension_of_names
from meshprof.records.rank_meta import GroupRecord, MonitorSettings, RankMeta
from meshprof.rundir import resolve_layout


@pytest.mark.parametrize(
    ("names", "dim"),
    [
        (["tp"], "tp"),
        (["dp"], "dp"),
        (["dp_shard"], "dp"),
        (["dp_replicate"], "dp"),
        (["cp"], "cp"),
        (["ep"], "ep"),
        (["pp"], "pp"),
        (["TP"], "tp"),
        # torchtitan: its data-loading, FSDP and expert-FSDP dims; flattened dims of older versions
        (["batch"], "dp"),
        (["fsdp"], "dp"),
        (["efsdp"], "dp"),
        (["dp_shard_cp"], "dp+cp"),
        (["dp_cp"], "dp+cp"),
        (["dp_shard_mod_ep"], "dp"),
        (["world", "tp"], "tp"),  # torchtitan TP 2 on 2 ranks: its world mesh and tp share a group
        (["world", "loss_mesh", "batch", "fsdp"], "dp"),  # torchtitan FSDP 2 on 2 ranks
        # transformers TP 2: the dense mesh's tp and the expert mesh's efsdp reuse the world group
        (["tp", "efsdp"], "tp"),
        (["efsdp", "tp"], "tp"),
        # names that say nothing
        (["world"], None),
        (["loss_mesh"], None),
        (["dim_0"], None),
        (["model"], None),
        ([], None),
    ],
)
def test_mesh_names_say_the_dimension(names: list[str], dim: str | None) -> None:
    assert dimension_of_names(names) == dim


def test_which_source_names_a_group() -> None:
    world = (0, 1)
    # the job's names beat a layout nobody gave, and the description
    assumed = Layout(dp=2, assumed=True)
    assert dimension_of(world, assumed, "default_pg", ["tp"]) == "tp"
    assert dimension_of(world, None, "default_pg", ["tp"]) == "tp"
    # the user's layout beats the job's names (where it places the group)
    assert dimension_of(world, Layout(dp=2), "default_pg", ["tp"]) == "dp"
    assert dimension_of(world, "dp=2,tp=1,pp=1", "default_pg", ["tp"]) == "dp"
    # ...and where it does not (a group of one rank), the names decide
    assert dimension_of((1,), Layout(dp=2), "mesh_pp", ["tp"]) == "tp"
    # no names: today's inference, the coordinates of whichever layout, else the description
    for lay in (assumed, Layout(dp=2)):
        assert dimension_of(world, lay, "default_pg") == dimension_of(world, lay, "default_pg", ())
        assert dimension_of(world, lay, "default_pg") == "dp"
    assert dimension_of(world, None, "mesh_tp") == "tp"
    assert dimension_of(world, None, "default_pg") == "other"
    # names that say nothing leave the decision to the rest
    assert dimension_of(world, assumed, "default_pg", ["world"]) == "dp"
    # assumed is not part of a layout's value
    assert assumed == Layout(dp=2)


def _meta(groups: list[GroupRecord], *, assumed: bool, monitor: dict[str, int] | None) -> RankMeta:
    return RankMeta(
        rank=0,
        world_size=4,
        layout={"dp": 4, "tp": 1, "pp": 1},
        layout_assumed=assumed,
        groups=groups,
        monitor=MonitorSettings(layout=monitor) if monitor is not None else None,
    )


def test_resolve_layout_drops_an_assumption_the_mesh_names_refute() -> None:
    pure_dp = {"dp": 4, "tp": 1, "pp": 1}
    world = GroupRecord(name="0", desc="default_pg", ranks=[0, 1, 2, 3])
    tp = GroupRecord(name="3", desc="mesh_tp", ranks=[0, 1], mesh_dims=["tp"])
    fsdp = GroupRecord(name="0", desc="default_pg", ranks=[0, 1, 2, 3], mesh_dims=["dp_shard"])
    # meshprof run without --layout assumed pure DP; a tp group of two ranks says otherwise
    assert resolve_layout(_meta([world, tp], assumed=True, monitor=pure_dp)) is None
    # names that agree with the assumption keep it, marked assumed
    kept = resolve_layout(_meta([fsdp], assumed=True, monitor=pure_dp))
    assert kept == Layout(dp=4) and kept is not None and kept.assumed
    # no names: the assumption stands (today's fallback)
    lay = resolve_layout(_meta([world], assumed=True, monitor=pure_dp))
    assert lay == Layout(dp=4) and lay is not None and lay.assumed
    # a layout the user gave is never dropped, whatever the names
    given = resolve_layout(_meta([world, tp], assumed=False, monitor=pure_dp))
    assert given == Layout(dp=4) and given is not None and not given.assumed
    other = resolve_layout(_meta([world, tp], assumed=True, monitor={"dp": 2, "tp": 2, "pp": 1}))
    assert other == Layout(dp=2, tp=2) and other is not None and not other.assumed


def _group_of(mesh: Any, dim: Any) -> dict[str, Any]:
    import torch.distributed as dist

    g = mesh.get_group(dim)
    return {"name": g.group_name, "ranks": dist.get_process_group_ranks(g)}


def _meshes_worker(rank: int, world: int) -> dict[str, Any]:
    """Build meshes the ways jobs do, with the recorder installed; return what it learnt and
    what DeviceMesh says of each dimension's group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    import meshprof

    original = DeviceMesh.__init__
    prof = meshprof.enable()
    try:
        patched = DeviceMesh.__init__ is not original
        oracle: dict[str, Any] = {}
        mesh2d = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        oracle["dp"] = _group_of(mesh2d, "dp")
        oracle["tp"] = _group_of(mesh2d, "tp")
        sliced = mesh2d["tp"]  # a slice: the same group, no new name
        assert sliced.get_group().group_name == oracle["tp"]["name"]
        # a 1-D mesh over the world reuses the world group (transformers' TP mesh does)
        world_tp = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        oracle["world_tp"] = _group_of(world_tp, None)
        # a flattened dimension (FSDP over dp x cp), and a mesh dropped before any write
        oracle["dp_tp"] = _group_of(mesh2d["dp", "tp"]._flatten("dp_tp"), None)
        dropped = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "cp"))
        oracle["pp"], oracle["cp"] = _group_of(dropped, "pp"), _group_of(dropped, "cp")
        del dropped
        # groups attached after __init__: an unflattened dimension, a mesh from groups
        unflat = world_tp._unflatten(0, (2, 2), ("dp_shard", "ep"))
        oracle["dp_shard"] = _group_of(unflat, "dp_shard")
        oracle["ep"] = _group_of(unflat, "ep")
        even, odd = dist.new_group([0, 2]), dist.new_group([1, 3])  # (every rank makes both)
        own = even if rank % 2 == 0 else odd
        own_mesh = DeviceMesh.from_group(own, "cpu", mesh_dim_names=("dp_replicate",))
        oracle["dp_replicate"] = _group_of(own_mesh, None)
        unnamed = init_device_mesh("cpu", (world,))
        for g in (mesh2d.get_group("dp"), mesh2d.get_group("tp"), unnamed.get_group()):
            dist.all_reduce(torch.ones(1), group=g)  # the recorder registers the groups used
        learnt = prof.mesh_names.names()
        groups = prof.meta()["groups"]  # what a rank file's meta gets (groups used so far)
        dist.barrier()
        return {
            "patched": patched,
            "learnt": learnt,
            "oracle": oracle,
            "world": dist.group.WORLD.group_name,
            "unnamed": unnamed.get_group().group_name,
            "meta_groups": groups,
            "device": prof.meta()["device"],
            "internal_errors": prof.internal_errors,
        }
    finally:
        meshprof.disable()
        assert DeviceMesh.__init__ is original  # the patch is undone


@pytest.fixture(scope="module")
def meshes() -> list[dict[str, Any]]:
    return run_ranks(_meshes_worker, 4, timeout=180)


def test_each_group_gets_the_names_device_mesh_gives_it(meshes: list[dict[str, Any]]) -> None:
    for out in meshes:
        assert out["patched"] and out["internal_errors"] == 0
        learnt, oracle = out["learnt"], out["oracle"]
        for dim in ("dp", "tp", "pp", "cp", "dp_shard", "ep", "dp_replicate"):
            name = oracle[dim]["name"]
            assert dim in learnt[name], (dim, oracle[dim], learnt)
            assert dimension_of_names(learnt[name]) == dimension_of_names([dim])
        # the world group: named by the 1-D TP mesh and the flattened dp_tp (both span it)
        assert oracle["world_tp"]["name"] == oracle["dp_tp"]["name"] == out["world"]
        assert oracle["world_tp"]["ranks"] == [0, 1, 2, 3]
        assert learnt[out["world"]] == ["tp", "dp_tp"]
        assert dimension_of_names(learnt[out["world"]]) == "tp"
        # every name learnt is one DeviceMesh gave that group (no group named twice wrongly)
        by_name = {}
        for dim, g in oracle.items():
            by_name.setdefault(g["name"], set()).add("tp" if dim == "world_tp" else dim)
        for name, dims in learnt.items():
            assert set(dims) <= by_name.get(name, set()), (name, dims)
        assert out["unnamed"] not in learnt or out["unnamed"] == out["world"]
        assert out["device"] == "cpu"


def test_the_rank_meta_carries_the_names(meshes: list[dict[str, Any]]) -> None:
    for out in meshes:
        used = {out["oracle"]["dp"]["name"], out["oracle"]["tp"]["name"], out["world"]}
        assert used <= {g["name"] for g in out["meta_groups"]}
        for g in out["meta_groups"]:
            rec = GroupRecord.from_dict(g)
            if rec.name in out["learnt"]:
                assert rec.mesh_dims == out["learnt"][rec.name]
            else:
                assert rec.mesh_dims is None


def _transformers_worker(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed
    from transformers.distributed import DistributedConfig
    from transformers.distributed.utils import initialize_distributed_mesh

    import meshprof

    os.environ.setdefault("LOCAL_RANK", str(rank))
    prof = meshprof.enable()
    try:
        _, meshes = initialize_distributed_mesh(DistributedConfig(tp_size=world))
        assert meshes is not None
        tp = meshes.get_mesh("tp").get_group().group_name
        learnt = prof.mesh_names.names()
        torch.distributed.barrier()  # (a rank leaving early breaks the other's group setup)
        return {"tp": tp, "learnt": learnt}
    finally:
        meshprof.disable()


@pytest.mark.timeout(180)
def test_transformers_tp_mesh_names_the_world_group_tp() -> None:
    """Hugging Face transformers' own meshes for ``DistributedConfig(tp_size=2)``: the TP
    dimension is the world group, which its expert mesh also names (``efsdp``): it is tp."""
    pytest.importorskip("transformers.distributed.utils")
    for out in run_ranks(_transformers_worker, 2, timeout=150):
        names = out["learnt"][out["tp"]]
        assert "tp" in names
        assert dimension_of_names(names) == "tp"


def _torchtitan_worker(
    rank: int, world: int, degrees: dict[str, Any], mesh_name: str
) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (its "fake" backend)
    import torchtitan.distributed.parallel_dims as parallel_dims

    import meshprof

    parallel_dims.device_type = "cpu"  # (torchtitan has no CPU path of its own)
    prof = meshprof.enable()
    try:
        dims = parallel_dims.ParallelDims(world_size=world, **degrees)
        dims.build_mesh()
        oracle = dims.get_mesh(mesh_name).get_group().group_name
        learnt = prof.mesh_names.names()
        dist.barrier()
        return {"oracle": oracle, "learnt": learnt}
    finally:
        meshprof.disable()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("degrees", "mesh_name", "expected"),
    [({"tp": 2}, "tp", "tp"), ({"dp_shard": 2}, "fsdp", "dp")],
)
def test_torchtitan_meshes_name_their_groups(
    degrees: dict[str, int], mesh_name: str, expected: str
) -> None:
    """torchtitan's own ParallelDims meshes on 2 ranks (its world, data-loading, dense and
    sparse meshes all over the same ranks): the group its TP (or FSDP) dimension uses is named
    for that dimension."""
    pytest.importorskip("torchtitan.distributed.parallel_dims")
    full: dict[str, Any] = {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "pp": 1, "ep": 1}
    full.update(degrees, spmd_backend="partial_dtensor")
    for out in run_ranks(_torchtitan_worker, 2, (full, mesh_name), timeout=200):
        names = out["learnt"][out["oracle"]]
        assert dimension_of_names(names) == expected, names


class _Mesh:
    """Something shaped like a DeviceMesh whose groups are not attached yet."""

    mesh_dim_names = ("tp",)


class _Broken:
    @property
    def mesh_dim_names(self) -> tuple[str, ...]:
        raise RuntimeError("inside meshprof")


def test_mesh_names_are_bounded_and_never_raise() -> None:
    from meshprof.comm import mesh_names as mn

    names = mn.MeshNames()
    errors: list[BaseException] = []
    names.on_error = errors.append
    calls: list[object] = []

    def original(mesh: object, *args: object, **kwargs: object) -> None:
        calls.append(mesh)

    init = names._wrap(original)
    keep = [_Mesh() for _ in range(mn.MAX_PENDING + 50)]
    for m in keep:
        init(m)  # waiting for groups that never come
    assert len(names._pending) == mn.MAX_PENDING
    assert names.names() == {} and len(names._pending) == mn.MAX_PENDING
    init(_Broken())  # an error inside meshprof: the job's __init__ ran, nothing raised
    assert len(calls) == len(keep) + 1 and len(errors) == 1
