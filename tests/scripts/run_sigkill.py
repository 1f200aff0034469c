"""3 ranks train a tiny model with no meshprof in it; rank 1 SIGKILLs itself mid-step.

Each step: a forward and backward, ``PER_STEP`` all_reduces, an optimizer step. ``argv[2]``
seconds after its first all_reduce returned (not after its start: on a loaded machine the ranks
may take seconds to reach their first collective), rank 1 decides that the step it starts is its
last: after ``KILL_AT`` all_reduces of that step it writes its own record
(``argv[1]/killed.json``: the step, when each of its all_reduces returned, when it died) and
kills itself with SIGKILL, with no warning and nothing flushed. The others block in the next
all_reduce until gloo sees the connection close.
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

PER_STEP = 3
KILL_AT = 2

out, run_s = sys.argv[1], float(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
done_ns: list[int] = []  # wall clock when each of this rank's all_reduces returned
kill_step = -1
for step in range(1_000_000):
    if rank == 1 and kill_step < 0 and done_ns and time.time_ns() - done_ns[0] >= run_s * 1e9:
        kill_step = step
    model(torch.randn(4, 8)).sum().backward()
    for i in range(PER_STEP):
        if step == kill_step and i == KILL_AT:
            record = {"step": step, "done_ns": done_ns, "kill_ns": time.time_ns()}
            with open(os.path.join(out, "killed.json"), "w") as f:
                json.dump(record, f)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(4))
        done_ns.append(time.time_ns())
    opt.step()
    opt.zero_grad()
