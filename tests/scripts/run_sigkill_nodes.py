"""For the multi-node root-cause test: every rank all_reduces in a loop; after 20 of them,
rank 1 writes ``argv[1]/killed.json`` and SIGKILLs itself. Rank 0 then fails in its next
all_reduce (the connection closed): a consequence, later than the cause."""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for i in range(1_000_000):
    if rank == 1 and i == 20:
        time.sleep(1.0)  # (its writer appends the 20 all_reduces meanwhile)
        with open(os.path.join(sys.argv[1], "killed.json"), "w") as f:
            json.dump({"kill_ns": time.time_ns()}, f)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(4))
