"""Write a simulated :class:`~sim.jobsim.Timeline` as a meshprof run directory: one rank file
per rank (events, step and phase spans with their compute time, a memory sample per step, the
groups, the layout, timestamp-exchange samples) on each rank's own clock, and the manifest.

Uses :mod:`meshprof.rundir` and :mod:`meshprof.events` only to lay out the files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshprof.events import EVENT_DTYPE, FLAG_ASYNC, MEMORY_DTYPE, OP_CODES, SPAN_DTYPE
from meshprof.rundir import Manifest, RankData, RankMeta, write_manifest, write_rank_file
from sim.jobsim import PHASES, Timeline, groups
from sim.recording import Recording, seen_completions

BASE_NS = 1_750_000_000 * 10**9
"""The true clock's zero, as a wall-clock time (ns)."""
SPAN_NAMES = [*PHASES, "step"]


def write_run(
    out: Path,
    tl: Timeline,
    lag_ns: int = 0,
    late_share: float = 0.0,
    late_ns: int = 0,
    lag_seed: int = 0,
    recording: Recording | None = None,
) -> Path:
    """Write ``tl`` under ``out`` (created); returns ``out``. The recorder may see completions
    late (a flaw of the recording, not of the job: :class:`~sim.recording.Recording`, whose
    flags are always written here — :func:`sim.check.load_recorded` strips them); ``lag_ns``,
    ``late_share``, ``late_ns``, ``lag_seed``: the async ops' lag of a recording given none
    (a completion waited for in C++ and polled, on a loaded machine: each late by a uniform
    draw in [0, ``lag_ns``), a share ``late_share`` of them by one in [``late_ns``,
    3 × ``late_ns``) instead)."""
    job = tl.job
    if recording is None:
        recording = Recording(lag_ns=lag_ns, late_share=late_share, late_ns=late_ns,
                              seed=lag_seed)  # fmt: skip
    seen = seen_completions(tl, recording)
    out.mkdir(parents=True, exist_ok=True)
    all_groups = groups(job)
    layout = {"dp": job.dp, "tp": job.tp, "pp": job.pp}
    for r in range(job.world):
        off = int(tl.offsets[r])
        mine = [g for g in all_groups if r in g.ranks]
        local = {g.name: i for i, g in enumerate(mine)}
        rows = tl.events[r]
        ops = [tl.ops[int(i)] for i in rows[:, 0]]
        ev = np.zeros(len(rows), dtype=EVENT_DTYPE)
        for j, op in enumerate(ops):
            if op.name == "p2p":
                send = op.members[0] == r
                ev[j]["op"] = OP_CODES["send" if send else "recv"]
                ev[j]["peer"] = op.members[1] if send else op.members[0]
            else:
                ev[j]["op"] = OP_CODES[op.name]
                ev[j]["peer"] = -1
            ev[j]["group"] = local[op.group]
            ev[j]["seq"] = op.seq
            ev[j]["in_bytes"] = op.nbytes
            ev[j]["out_bytes"] = op.nbytes
            ev[j]["flags"] = FLAG_ASYNC if op.is_async else 0
        ev["start_ns"] = rows[:, 1] + BASE_NS + off
        ev["duration_ns"] = seen[r] - rows[:, 1]
        ev["step"] = tl.step_of[r]
        sp = np.zeros(len(tl.spans[r]), dtype=SPAN_DTYPE)
        for j, (name, step, t0, t1, cpu) in enumerate(tl.spans[r]):
            is_step = name == "step"
            sp[j] = (0 if is_step else 1, 0, 0 if is_step else 1, SPAN_NAMES.index(name), step,
                     t0 + BASE_NS + off, t1 - t0, 4096 if is_step else 0, 8 if is_step else 0,
                     cpu)  # fmt: skip
        sp = sp[np.argsort(sp["start_ns"], kind="stable")]
        mem = np.zeros(job.steps, dtype=MEMORY_DTYPE)
        mem["step"] = np.arange(job.steps)
        mem["t_ns"] = tl.step_end[r] + BASE_NS + off
        mem["allocated"] = mem["reserved"] = mem["peak"] = -1
        mem["rss"] = 2**30
        mem["capacity"] = 2**34
        samples = [
            [a + BASE_NS + off, b + BASE_NS, c + BASE_NS + off] for a, b, c in tl.exchange[r]
        ]
        meta = RankMeta(
            rank=r,
            world_size=job.world,
            hostname=f"node{r // 8}",
            groups=[
                {"name": g.name, "desc": g.desc, "ranks": list(g.ranks), "backend": "nccl"}
                for g in mine
            ],
            dtypes=["bfloat16"],
            labels=[],
            span_names=SPAN_NAMES,
            layout=layout,
            clock_sync={
                "method": "pg",
                "ref_rank": 0,
                "rank": r,
                "rounds": len(samples),
                "samples": samples,
                "error": "",
            },
        )
        write_rank_file(out, RankData(r, ev, sp, mem, meta))
    write_manifest(out, Manifest(world_size=job.world, command=f"jobsim {job}", layout=layout))
    return out
