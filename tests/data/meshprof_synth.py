"""Test helpers: synthetic rank files with a known true timeline, and a real-run worker.

Imported by tests as ``from data.meshprof_synth import ...`` (tests/ is on sys.path).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, OP_CODES, SPAN_DTYPE
from meshprof.rundir import Manifest, RankData, RankMeta, write_manifest, write_rank_file

MS = 1_000_000
US = 1_000
BASE = 1_700_000_000 * 10**9
PHASES = ["forward", "backward", "optimizer"]


_SPAN_FIELDS = (
    "kind",
    "status",
    "depth",
    "name",
    "step",
    "start_ns",
    "duration_ns",
    "tokens",
    "samples",
)
_EVENT_FIELDS = (
    "op",
    "status",
    "dtype",
    "flags",
    "group",
    "peer",
    "seq",
    "in_bytes",
    "out_bytes",
    "start_ns",
    "duration_ns",
    "step",
)
_MEM_FIELDS = ("step", "t_ns", "allocated", "reserved", "peak", "rss", "capacity")


def _rows(rows: list[tuple], dtype: np.dtype, fields: tuple[str, ...]) -> np.ndarray:
    """A structured array filled by field name (columns added to the schema later stay -1)."""
    a = np.zeros(len(rows), dtype=dtype)
    for n in dtype.names:
        if n not in fields:
            a[n] = -1
    for i, f in enumerate(fields):
        a[f] = [r[i] for r in rows]
    return a


def spans_array(rows: list[tuple]) -> np.ndarray:
    return _rows(rows, SPAN_DTYPE, _SPAN_FIELDS)


def events_array(rows: list[tuple]) -> np.ndarray:
    return _rows(rows, EVENT_DTYPE, _EVENT_FIELDS)


def memory_array(rows: list[tuple]) -> np.ndarray:
    return _rows(rows, MEMORY_DTYPE, _MEM_FIELDS)


def _all_reduce(seq: int, nbytes: int, start_ns: int, duration_ns: int, step: int) -> tuple:
    """An event row (fields of _EVENT_FIELDS): a completed all_reduce on the world group."""
    return (
        OP_CODES["all_reduce"],
        0,
        0,
        0,
        0,
        -1,
        seq,
        nbytes,
        nbytes,
        start_ns,
        duration_ns,
        step,
    )


def synthetic_run(
    out: Path,
    world: int,
    clock_offsets_ns: list[int],
    *,
    steps: int = 6,
    slow_rank: int = -1,
    extra_ns: int = 0,
    exchange: bool = True,
    seed: int = 0,
    completion_jitter_ns: int = 20 * US,
    collectives: Sequence[tuple[int, int]] = ((4096, 1 * MS),),
    mem_rank: int = -1,
    mem_extra_bytes: int = 0,
    step_spans: bool = True,
    tokens_per_step: int = 0,
) -> dict:
    """Write rank files whose local clocks read true_time + clock_offsets_ns[r].

    Each step: forward (10 ms, + extra on slow_rank), backward (5 ms compute, then the
    ``collectives``, back to back: for each (bytes, latency) an all_reduce of that many bytes on
    the world group that completes ``latency`` ns after its last arrival; by default one of
    4 KiB, 1 ms), optimizer (2 ms). Memory: (100 + rank) MiB of RSS, + ``mem_extra_bytes`` on
    ``mem_rank``. ``step_spans=False`` writes no step or phase spans (collectives only); each
    step span carries ``tokens_per_step`` tokens.
    Two runs with the same seed draw the same random numbers whatever the other arguments, so
    they differ by exactly what the arguments change.
    Returns the truth: {"arrivals": {(rank, seq): true issue time}, ...}.
    """
    rng = np.random.default_rng(seed)
    rng_more = np.random.default_rng(seed + 1)  # the collectives before the last one
    colls = list(collectives)
    n_coll = len(colls)
    groups = [{"name": "0", "desc": "default_pg", "ranks": list(range(world)), "backend": "gloo"}]
    events = {r: [] for r in range(world)}
    spans = {r: [] for r in range(world)}
    mem = {r: [] for r in range(world)}
    arrivals: dict[tuple[int, int], int] = {}
    t_start = {r: BASE + int(rng.integers(0, 200 * US)) for r in range(world)}
    for k in range(steps):
        fwd = {
            r: 10 * MS + (extra_ns if r == slow_rank else 0) + int(rng.integers(0, 50 * US))
            for r in range(world)
        }
        arrive = {r: t_start[r] + fwd[r] + 5 * MS for r in range(world)}
        for i, (nbytes, latency) in enumerate(colls[:-1]):
            done = max(arrive.values()) + latency
            for r in range(world):
                end = done + int(rng_more.integers(-completion_jitter_ns, completion_jitter_ns + 1))
                seq = k * n_coll + i
                arrivals[(r, seq)] = arrive[r]
                start = arrive[r] + clock_offsets_ns[r]
                events[r].append(_all_reduce(seq, nbytes, start, end - arrive[r], k))
                arrive[r] = end
        done = max(arrive.values()) + (colls[-1][1] if colls else 0)
        nxt = {}
        for r in range(world):
            off = clock_offsets_ns[r]
            end_r = done + int(rng.integers(-completion_jitter_ns, completion_jitter_ns + 1))
            if colls:
                seq = k * n_coll + n_coll - 1
                arrivals[(r, seq)] = arrive[r]
                dur = end_r - arrive[r]
                events[r].append(_all_reduce(seq, colls[-1][0], arrive[r] + off, dur, k))
            else:
                end_r = arrive[r]
            s_end = end_r + 2 * MS
            if step_spans:
                step_ns = s_end - t_start[r]
                spans[r].append((0, 0, 0, 3, k, t_start[r] + off, step_ns, tokens_per_step, 0))
                spans[r].append((1, 0, 1, 0, k, t_start[r] + off, fwd[r], 0, 0))
                spans[r].append(
                    (1, 0, 1, 1, k, t_start[r] + fwd[r] + off, end_r - t_start[r] - fwd[r], 0, 0)
                )
                spans[r].append((1, 0, 1, 2, k, end_r + off, 2 * MS, 0, 0))
            rss = (100 + r) * 2**20 + (mem_extra_bytes if r == mem_rank else 0)
            mem[r].append((k, s_end + off, -1, -1, -1, rss, 2**34))
            nxt[r] = s_end + int(rng.integers(0, 100 * US))
        t_start = nxt
    for r in range(world):
        samples = []
        if exchange and r != 0:
            t0 = BASE - 10 * MS
            for _ in range(20):
                d1, d2 = int(rng.integers(30 * US, 300 * US)), int(rng.integers(30 * US, 300 * US))
                samples.append(
                    [
                        t0 + clock_offsets_ns[r],
                        t0 + d1 + clock_offsets_ns[0],
                        t0 + d1 + d2 + clock_offsets_ns[r],
                    ]
                )
                t0 += d1 + d2 + 10 * US
        meta = RankMeta(
            rank=r,
            world_size=world,
            hostname=f"node{r // 2}",
            groups=groups,
            dtypes=["float32"],
            labels=[],
            span_names=[*PHASES, "step"],
            clock_sync={
                "method": "pg",
                "ref_rank": 0,
                "rank": r,
                "rounds": 20,
                "samples": samples,
                "error": "",
            },
        )
        write_rank_file(
            out,
            RankData(
                r,
                events_array(events[r]),
                spans_array(spans[r]),
                memory_array(mem[r]),
                meta,
            ),
        )
    write_manifest(out, Manifest(world_size=world, command="synthetic"))
    return {"arrivals": arrivals}


def shift_rank_file(path: Path, shift_ns: int) -> None:
    """Add ``shift_ns`` to every local timestamp of one rank file (its clock reads later)."""
    from meshprof.rundir import load_rank_file

    rd = load_rank_file(path)
    ev, sp, mm = rd.events.copy(), rd.spans.copy(), rd.memory.copy()
    ev["start_ns"] += shift_ns
    sp["start_ns"] += shift_ns
    mm["t_ns"] += shift_ns
    cs = rd.meta.clock_sync.to_dict() if rd.meta.clock_sync is not None else {}
    cs["samples"] = [[a + shift_ns, b, c + shift_ns] for a, b, c in cs.get("samples", [])]
    write_rank_file(path.parent, RankData(rd.rank, ev, sp, mm, rd.meta.updated(clock_sync=cs)))


def real_worker(
    rank: int, world: int, out: str, slow_rank: int, extra_s: float, steps: int, label: str = ""
) -> dict:
    """A real gloo run: timestamp exchange, then steps of forward (sleep 20 ms, + extra_s on
    slow_rank) / backward (all_reduce) / optimizer, spans timed with time.time_ns, written as a
    rank file the way the launcher writes one."""
    import torch
    import torch.distributed as dist

    import meshprof
    from meshprof.comm.clocksync import exchange_timestamps

    prof = meshprof.enable()
    sync = exchange_timestamps(rounds=20)
    names = [*PHASES, "step"]
    rows = []
    mem = []
    t = torch.ones(1024)
    for k in range(steps):
        prof.step = k
        s0 = time.time_ns()
        f0 = time.time_ns()
        time.sleep(0.02 + (extra_s if rank == slow_rank else 0.0))
        b0 = time.time_ns()
        dist.all_reduce(t)
        if label:
            # the slow rank is slow before this one too: right after the first all_reduce who
            # arrives last would be gloo's completion jitter, not the straggler
            time.sleep(0.002 + (extra_s / 2 if rank == slow_rank else 0.0))
            with prof.label(label):
                dist.all_reduce(t)
        o0 = time.time_ns()
        t.mul_(0.5)
        o1 = time.time_ns()
        rows += [
            (0, 0, 0, 3, k, s0, o1 - s0, 0, 0),
            (1, 0, 1, 0, k, f0, b0 - f0, 0, 0),
            (1, 0, 1, 1, k, b0, o0 - b0, 0, 0),
            (1, 0, 1, 2, k, o0, o1 - o0, 0, 0),
        ]
        mem.append((k, o1, -1, -1, -1, (200 + 50 * (rank == slow_rank)) * 2**20, 2**34))
    dist.barrier()
    cols, _ = prof.columns()
    meta = RankMeta(
        rank=rank,
        world_size=world,
        hostname=socket.gethostname() + ("<b>&amp;" if label else ""),
        groups=[
            {"name": g.name, "desc": g.desc, "ranks": list(g.ranks), "backend": g.backend}
            for g in prof.log.groups
        ],
        dtypes=list(prof.log.dtypes),
        labels=list(prof.log.labels),
        span_names=names,
        clock_sync=sync,
    )
    write_rank_file(Path(out), RankData(rank, cols, spans_array(rows), memory_array(mem), meta))
    if rank == 0:
        write_manifest(
            Path(out), Manifest(world_size=world, command=json.dumps(["train.py", label]))
        )
    return {"sync_error": sync["error"], "samples": len(sync["samples"])}
