"""The (dp, tp, pp) ``DeviceMesh`` of a layout, with the coordinates :class:`RankMapping` gives.

Needs torch; imported only by code that starts distributed work (the demo's build, tests)."""

from __future__ import annotations

from typing import Any

from meshprof.errors import MeshprofError
from meshprof.parallel.parallel_config import ParallelConfig

MESH_DIM_NAMES = ("dp", "tp", "pp")


def build_mesh(config: ParallelConfig, device_type: str = "cpu") -> Any:
    """The (dp, tp, pp) DeviceMesh over ``range(world_size)``; its coordinates equal
    :class:`~meshprof.parallel.mapping.RankMapping`'s because PP is the last (fastest) mesh
    dimension. Needs an initialized default process group of ``config.world_size`` ranks. The
    mesh's groups are named ``mesh_dp``, ``mesh_tp``, ``mesh_pp`` (their ``group_desc``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise MeshprofError(
            "build_mesh needs torch.distributed to be initialized (run under torchrun or meshprof.launch.spawn)"
        )
    config.validate(dist.get_world_size())
    return init_device_mesh(
        device_type, (config.dp, config.tp, config.pp), mesh_dim_names=MESH_DIM_NAMES
    )


__all__ = ["MESH_DIM_NAMES", "build_mesh"]
