"""A tiny tensor-parallel inference script (no meshprof in it, no optimizer) for `meshprof run`.

Two ranks serve ``argv[2]`` requests (default 10) with an MLP split over a 1-D DeviceMesh
(DTensor, ColwiseParallel + RowwiseParallel: an all_reduce per request). Each request is one
forward of the model under ``torch.inference_mode()``; the model sleeps 1-5 ms in it so that
requests take visibly different times. The script writes its own timing of every request
(``time.perf_counter_ns`` around the call) to ``argv[1]/oracle_rank{r}.json``.

``argv[3]`` chooses the mesh: ``tp`` (default: one dimension named "tp" over every rank, so
DeviceMesh reuses the world group for it, as Hugging Face transformers' TP does), ``unnamed``
(the same mesh without dimension names), or ``dp=D,tp=T`` (D × T ranks, dimensions named "dp"
and "tp": TP inside each replica, then per request an all_reduce of the output over "dp", and
one all_reduce over the world group at the end). The oracle file also holds what DeviceMesh
itself says of each dimension's group (``mesh.get_group(dim)``: its name and global ranks).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

REQUESTS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
MESH = sys.argv[3] if len(sys.argv) > 3 else "tp"


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)
        self.delay_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return self.down(torch.relu(self.up(x)))


dist.init_process_group("gloo")
rank = dist.get_rank()
world = dist.get_world_size()
if MESH == "tp":
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    tp_mesh, dims = mesh, {"tp": mesh.get_group()}
elif MESH == "unnamed":
    mesh = tp_mesh = init_device_mesh("cpu", (world,))
    dims = {"dim_0": mesh.get_group()}
else:
    sizes = dict(kv.split("=") for kv in MESH.split(","))
    mesh = init_device_mesh(
        "cpu", (int(sizes["dp"]), int(sizes["tp"])), mesh_dim_names=("dp", "tp")
    )
    tp_mesh, dims = mesh["tp"], {"dp": mesh.get_group("dp"), "tp": mesh.get_group("tp")}
groups = {
    d: {"name": g.group_name, "ranks": dist.get_process_group_ranks(g)} for d, g in dims.items()
}
groups["world"] = {"name": dist.group.WORLD.group_name, "ranks": list(range(world))}
torch.manual_seed(0)
model = parallelize_module(MLP(), tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
times = []
starts = []
with torch.inference_mode():
    for i in range(REQUESTS):
        model.delay_s = 0.001 * (1 + (i * 3) % 5)
        x = torch.randn(4, 16)
        t0 = time.perf_counter_ns()
        y = model(x)
        t1 = time.perf_counter_ns()
        starts.append(t0)
        times.append(t1 - t0)
        assert y.shape == (4, 16)
        if "dp" in dims:
            dist.all_reduce(y.clone(), group=dims["dp"])
    if "dp" in dims:
        dist.all_reduce(torch.tensor([REQUESTS]))
with open(os.path.join(sys.argv[1], f"oracle_rank{rank}.json"), "w") as f:
    oracle = {"requests": REQUESTS, "request_ns": times, "elapsed_ns": t1 - starts[0]}
    json.dump({**oracle, "groups": groups}, f)
dist.destroy_process_group()
