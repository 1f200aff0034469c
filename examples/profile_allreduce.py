"""Profile a 4-rank gloo job: a small DDP model plus explicit collectives, then print the summary.

    python examples/profile_allreduce.py [--world-size 4] [--steps 5] [--out DIR]

Each rank enables meshprof, trains a tiny model with DistributedDataParallel (its gradient
all-reduces come from DDP's C++ reducer), issues a few collectives of its own, and writes
``rankN.json`` with ``export_json``. Rank 0's table is printed; ``meshprof summary rank0.json``
prints it again later.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from meshprof.launch.spawn import run_ranks


def train(rank: int, world_size: int, steps: int, out_dir: str) -> str:
    import torch
    import torch.distributed as dist
    from torch import nn

    import meshprof

    prof = meshprof.enable()  # enable at the same point on every rank: seq numbers then agree
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)), bucket_cap_mb=0.1
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        prof.step = step
        x = torch.randn(32, 64)
        loss = nn.functional.cross_entropy(model(x), torch.randint(0, 10, (32,)))
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        # explicit collectives: a metric all-reduce, a 1 MiB all-gather, a broadcast
        metric = loss.detach().clone()
        dist.all_reduce(metric)
        chunks = [torch.empty(65536) for _ in range(world_size)]
        dist.all_gather(chunks, torch.randn(65536))
        dist.broadcast(torch.zeros(1024), src=0)
    dist.barrier()
    path = Path(out_dir) / f"rank{rank}.json"
    prof.export_json(path)
    return prof.summary()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=None, help="directory for rankN.json (default: a temp dir)")
    args = ap.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="meshprof-example-")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    summaries = run_ranks(train, args.world_size, (args.steps, out_dir), timeout=300)
    print(summaries[0])
    print(f"exports: {out_dir}/rank0.json ... rank{args.world_size - 1}.json")
    print(f"again:   meshprof summary {out_dir}/rank0.json")


if __name__ == "__main__":
    main()
