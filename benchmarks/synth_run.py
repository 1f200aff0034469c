"""Write a realistic synthetic run directory: N ranks × M collectives, fast (vectorized numpy).

The job is a dp × tp × pp mesh (``--layout DPxTPxPP``, e.g. ``8x4x8`` for 256 ranks; by default
N/4 × 2 × 2 for multiples of 8, else pure data parallel). Every step has the same collective
template on every rank, so sequence numbers agree and everything matches across ranks:

- ``data`` phase: compute only;
- ``forward``: TP all_reduces between layer computations, and every 50th slot a pipeline
  send / recv between the stage pairs (0, 1), (2, 3), ... (even stage → odd stage);
- ``backward``: TP all_reduces, a DP reduce_scatter every 10th slot, pipeline sends back
  (odd stage → even stage) every 50th;
- ``optimizer``: DP all_gathers and one all_reduce over the world group (the grad norm).

Collectives are synchronous: a rank issues slot j+1 after slot j completed plus its compute gap;
a collective completes when its last member arrived plus a size-dependent duration, so the early
members wait. One rank (``--slow-rank``, default the last) computes ``--slow``
longer in its forward phase (default 30 %; in every phase with ``--slow-all``): it arrives last and the others wait for it. Every
rank's clock is off by up to ``--clock-ms`` (default 3 ms; uniform in ±that, rank 0 exact),
recorded as a timestamp exchange in ``meta["clock_sync"]`` unless ``--no-exchange`` (then only
the collectives can align the clocks). Steps start on a common grid, one memory sample
(CUDA-like) per step. The true offsets and the slow rank are returned by :func:`write_run`
(``aligned_offsets_ns``: add to a rank's timestamps to get rank 0's clock).

    python benchmarks/synth_run.py OUT_DIR [--ranks 8] [--collectives 1000000] [--steps 1000]
                                           [--layout 8x4x8] [--clock-ms 30] [--no-exchange]

Writes OUT_DIR/manifest.json and a folder of segments per rank, OUT_DIR/rankNNNNN/ (through
meshprof's own writer, :func:`meshprof.rundir.rank_segments.write_rank_segments`: the format a
real run leaves, groups as ranges); ``--format npz``: one rankNNNNN.npz file per rank, as older
versions wrote. ``--template small``: 6 collectives per step on every kind of group (tp
all_reduce, pipeline send/recv both ways, dp reduce_scatter, world all_reduce), for runs whose
point is the world size. At the end it prints the bytes on disk: per event, per rank folder and
per rank meta.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, OP_CODES, SPAN_DTYPE
from meshprof.records.rank_meta import ClockSync, GroupRecord
from meshprof.rundir import Manifest, RankData, RankMeta, write_manifest, write_rank_file
from meshprof.rundir.rank_segments import write_rank_segments

US = 1_000
MS = 1_000_000
BASE_NS = 1_750_000_000 * 10**9
SPAN_NAMES = ["data", "forward", "backward", "optimizer", "step"]
KINDS = ("world", "dp", "tp", "pp_fwd", "pp_bwd")


@dataclass(frozen=True, slots=True)
class Template:
    """One step's collectives, the same on every rank (arrays over slots)."""

    kind: np.ndarray
    """int: index into KINDS (which group the slot runs on)."""
    op: np.ndarray
    """int: op code (EVENT_DTYPE op) for the collectives; p2p slots are decided per rank."""
    nbytes: np.ndarray
    """int64: message size (bytes)."""
    gap_ns: np.ndarray
    """int64: compute before the slot (ns)."""
    phase: np.ndarray
    """int: 1 forward, 2 backward, 3 optimizer."""


def layout_for(n: int, layout: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    """(dp, tp, pp): ``layout`` when given (its product must be n, pp even or 1), else
    N/4 × 2 × 2 for multiples of 8, else pure data parallel."""
    if layout is not None:
        dp, tp, pp = (int(x) for x in layout)
        if dp * tp * pp != n or min(dp, tp, pp) < 1:
            raise ValueError(f"layout {dp}x{tp}x{pp} does not have {n} ranks")
        if pp > 1 and pp % 2:
            raise ValueError(f"pp={pp}: the generator pairs pipeline stages, pp must be even or 1")
        return dp, tp, pp
    if n % 8 == 0:
        return n // 4, 2, 2
    return n, 1, 1


def parse_layout(text: str) -> tuple[int, int, int]:
    """ "8x4x8" → (8, 4, 8)."""
    parts = text.lower().replace("×", "x").split("x")
    if len(parts) != 3:
        raise ValueError(f"layout {text!r}: expected DPxTPxPP, e.g. 8x4x8")
    dp, tp, pp = (int(p) for p in parts)
    return dp, tp, pp


def make_template(k: int, rng: np.random.Generator) -> Template:
    """k slots: 40 % forward, 55 % backward, the rest optimizer."""
    j = np.arange(k)
    f_end, b_end = int(0.4 * k), int(0.95 * k)
    phase = np.where(j < f_end, 1, np.where(j < b_end, 2, 3))
    kind = np.full(k, KINDS.index("tp"))
    kind[(phase == 1) & (j % 50 == 49)] = KINDS.index("pp_fwd")
    kind[(phase == 2) & (j % 10 == 0)] = KINDS.index("dp")
    kind[(phase == 2) & (j % 50 == 49)] = KINDS.index("pp_bwd")
    kind[phase == 3] = KINDS.index("dp")
    kind[-1] = KINDS.index("world")
    op = np.full(k, OP_CODES["all_reduce"])
    op[(phase == 2) & (kind == KINDS.index("dp"))] = OP_CODES["reduce_scatter"]
    op[(phase == 3) & (kind == KINDS.index("dp"))] = OP_CODES["all_gather"]
    nbytes = np.where(
        kind == KINDS.index("tp"),
        2**20,
        np.where(
            kind == KINDS.index("dp"), 2**24, np.where(kind == KINDS.index("world"), 4, 2**22)
        ),
    ).astype(np.int64)
    gap = rng.integers(20 * US, 60 * US, size=k).astype(np.int64)
    return Template(kind, op, nbytes, gap, phase)


def make_small_template(rng: np.random.Generator) -> Template:
    """6 slots: forward tp all_reduce, pipeline send (even stage → odd), backward tp
    all_reduce, pipeline send back, dp reduce_scatter, and the world all_reduce (grad norm)."""
    names = ("tp", "pp_fwd", "tp", "pp_bwd", "dp", "world")
    kind = np.asarray([KINDS.index(k) for k in names])
    phase = np.asarray([1, 1, 2, 2, 2, 3])
    op = np.full(len(names), OP_CODES["all_reduce"])
    op[4] = OP_CODES["reduce_scatter"]
    nbytes = np.asarray([2**20, 2**22, 2**20, 2**22, 2**24, 4], dtype=np.int64)
    gap = rng.integers(20 * US, 60 * US, size=len(names)).astype(np.int64)
    return Template(kind, op, nbytes, gap, phase)


def groups_for(
    n: int, layout: tuple[int, int, int] | None = None
) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Run-wide group list and, per kind, the member matrix (instances × size, global ranks);
    ``pairs`` holds the pipeline stage pairs (even stage, odd stage) of every pp group."""
    dp, tp, pp = layout_for(n, layout)
    r = np.arange(n).reshape(dp, tp, pp)  # rank = dp_rank·tp·pp + tp_rank·pp + pp_rank
    members = {
        "world": np.arange(n)[None, :],
        "dp": r.transpose(1, 2, 0).reshape(-1, dp),
        "tp": r.transpose(0, 2, 1).reshape(-1, tp),
        "pp": r.reshape(-1, pp),
        "pairs": r.reshape(-1, 2) if pp >= 2 else r.reshape(-1, 1),
    }
    groups = [{"name": "0", "desc": "default_pg", "ranks": range(n), "backend": "nccl"}]
    for dim in ("dp", "tp", "pp"):
        m = members[dim]
        if m.shape[1] < 2:
            continue
        for i, row in enumerate(m):
            groups.append(
                {
                    "name": f"{dim}{i}",
                    "desc": f"mesh_{dim}",
                    "ranks": row.tolist(),
                    "backend": "nccl",
                }
            )
    return groups, members


def _duration(nbytes: np.ndarray) -> np.ndarray:
    """Latency + size / 50 GB/s (ns)."""
    return (15 * US + nbytes // 50).astype(np.int64)


def simulate(
    n: int,
    steps: int,
    t: Template,
    slow_rank: int,
    slow: float,
    rng: np.random.Generator,
    layout: tuple[int, int, int] | None = None,
    slow_phases: tuple[int, ...] = (1,),
    extra_ns: Mapping[int, int] | None = None,
    extra_phase: int = 1,
    jitter: bool = True,
    slow_from: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival and completion times relative to each step's start: (ranks, steps, slots) int64,
    and each step's end (ranks, steps). The slow rank's compute is longer in ``slow_phases``
    (1 forward, 2 backward, 3 optimizer). ``extra_ns`` (rank → ns) adds exactly that much
    compute per step to those ranks, spread evenly over the compute gaps of phase
    ``extra_phase``.
    ``jitter=False``: no random noise (every rank's data loading, gaps, completions and step
    tail are the same), so the only imbalance is the one injected; the random draws are the
    same either way. ``slow_from``: the slow rank is slow from this step on (a fault that starts
    mid-run)."""
    _, members = groups_for(n, layout)
    k = len(t.kind)
    noise = 1 if jitter else 0
    arr = np.empty((n, steps, k), dtype=np.int64)
    done = np.empty((n, steps, k), dtype=np.int64)
    data_ns = 300 * US + noise * (
        rng.integers(200 * US, 400 * US, size=(n, steps)).astype(np.int64) - 300 * US
    )
    prev = data_ns
    factor = np.ones((n, steps))
    if 0 <= slow_rank < n:
        factor[slow_rank, slow_from:] += slow
    extra = np.zeros((n, k), dtype=np.int64)  # extra compute before each slot (ns)
    in_phase = np.flatnonzero(t.phase == extra_phase)
    for r, x in (extra_ns or {}).items():
        if len(in_phase):
            extra[r, in_phase] = int(x) // len(in_phase)
            extra[r, in_phase[0]] += int(x) - int(x) // len(in_phase) * len(in_phase)
    dur = _duration(t.nbytes)
    pp_m = members["pairs"] if members["pp"].shape[1] >= 2 else None
    for j in range(k):
        gap = t.gap_ns[j] * (factor if t.phase[j] in slow_phases else np.ones((n, steps)))
        a = (
            prev
            + gap.astype(np.int64)
            + extra[:, j][:, None]
            + noise * rng.integers(0, 5 * US, size=(n, steps))
        )
        kind = KINDS[t.kind[j]]
        m = pp_m if kind.startswith("pp") else members[kind]
        if m is None or m.shape[1] < 2:  # dimension of size 1: the slot runs on the world group
            m = members["world"]
        c = np.empty_like(a)
        last = a[m].max(axis=1)  # (instances, steps)
        c[m] = (last + dur[j])[:, None, :] + noise * rng.integers(0, 3 * US, size=(*m.shape, steps))
        arr[:, :, j] = a
        done[:, :, j] = c
        prev = c
    end = prev + 600 * US + noise * (rng.integers(500 * US, 700 * US, size=(n, steps)) - 600 * US)
    return arr, done, end


def write_run(
    out: Path,
    n: int = 8,
    collectives: int = 1_000_000,
    steps: int = 1000,
    slow_rank: int | None = None,
    slow: float = 0.30,
    seed: int = 0,
    *,
    layout: tuple[int, int, int] | None = None,
    clock_ms: float = 3.0,
    exchange: bool = True,
    slow_phases: tuple[int, ...] = (1,),
    extra_ns: Mapping[int, int] | None = None,
    extra_phase: int = 1,
    jitter: bool = True,
    slow_from: int = 0,
    fmt: str = "segments",
    template: str = "default",
) -> dict:
    """Write the run directory (``fmt``: "segments", a folder per rank written by meshprof's
    own writer, or "npz", the rank files of older versions; ``template``: "default" or
    "small", :func:`make_small_template`); returns a summary (events per rank, layout, truth:
    ``slow_rank``, ``clock_offsets_ns`` = each rank's clock minus the true clock,
    ``aligned_offsets_ns`` = what clock alignment should find: its negation, and
    ``job_step_end_ns``: per step, the true time from the step's start to the end of its last
    rank). ``extra_ns``, ``extra_phase``, ``jitter``, ``slow_from``: see :func:`simulate`."""
    if fmt not in ("segments", "npz"):
        raise ValueError(f"format {fmt!r}: expected segments or npz")
    rng = np.random.default_rng(seed)
    if template == "small":
        t = make_small_template(rng)
    elif template == "default":
        t = make_template(max(collectives // steps, 2), rng)
    else:
        raise ValueError(f"template {template!r}: expected default or small")
    k = len(t.kind)
    slow_rank = n - 1 if slow_rank is None else slow_rank
    dp, tp, pp = layout_for(n, layout)
    arr, done, end = simulate(
        n,
        steps,
        t,
        slow_rank,
        slow,
        rng,
        (dp, tp, pp),
        slow_phases,
        extra_ns=extra_ns,
        extra_phase=extra_phase,
        jitter=jitter,
        slow_from=slow_from,
    )
    period = int(end.max()) + 1 * MS
    step_start = BASE_NS + np.arange(steps, dtype=np.int64) * period  # true clock
    span = max(int(clock_ms * MS), 1)
    offsets = rng.integers(-span, span, size=n).astype(np.int64)
    offsets[0] = 0
    groups, members = groups_for(n, (dp, tp, pp))
    gindex = {g["name"]: i for i, g in enumerate(groups)}
    records = [
        GroupRecord(name=g["name"], desc=g["desc"], ranks=g["ranks"], backend=g["backend"])
        for g in groups
    ]  # (one record per group, shared by its members' metas; members as ranges)
    # per rank: the groups it belongs to (in run order) and, per dimension, its instance
    mine: list[list[GroupRecord]] = [[records[0]] for _ in range(n)]
    inst_of: dict[str, np.ndarray] = {}
    for dim in ("dp", "tp", "pp"):
        m = members[dim]
        inst_of[dim] = np.empty(n, dtype=np.int64)
        for i, row in enumerate(m):
            inst_of[dim][row] = i
        if m.shape[1] < 2:
            continue
        for i, row in enumerate(m):
            g = records[gindex[f"{dim}{i}"]]
            for x in row.tolist():
                mine[x].append(g)
    for r in range(n):
        my_groups = mine[r]
        local = {str(g.name): i for i, g in enumerate(my_groups)}
        # this rank's group (local code), peer and op per slot
        code = np.zeros(k, dtype=np.uint16)
        peer = np.full(k, -1, dtype=np.int32)
        op = t.op.astype(np.uint8).copy()
        for kind_i, kind in enumerate(KINDS):
            sel = t.kind == kind_i
            if not sel.any():
                continue
            dim = "pp" if kind.startswith("pp") else kind
            if dim == "world" or members[dim].shape[1] < 2:
                code[sel] = local["0"]
                continue
            inst = int(inst_of[dim][r])
            code[sel] = local[f"{dim}{inst}"]
            if kind.startswith("pp"):
                stage = r % pp
                other = r + 1 if stage % 2 == 0 else r - 1  # pairs (0, 1), (2, 3), ...
                sends = (stage % 2 == 0) == (kind == "pp_fwd")
                op[sel] = OP_CODES["send"] if sends else OP_CODES["recv"]
                peer[sel] = other
        # sequence numbers: per group, and per (pair, direction) for p2p (the kinds of a
        # dimension of size 1 run on the world group: they share its counter)
        seq_in_step = np.zeros(k, dtype=np.int64)
        per_step = np.zeros(k, dtype=np.int64)
        is_p2p = t.kind >= KINDS.index("pp_fwd")
        counter = code.astype(np.int64) * (len(KINDS) + 1) + np.where(is_p2p, t.kind + 1, 0)
        for c in np.unique(counter).tolist():
            sel = counter == c
            seq_in_step[sel] = np.arange(int(sel.sum()))
            per_step[sel] = int(sel.sum())
        step_col = np.repeat(np.arange(steps, dtype=np.int64), k)
        ev = np.zeros(steps * k, dtype=EVENT_DTYPE)
        ev["op"] = np.tile(op, steps)
        ev["group"] = np.tile(code, steps)
        ev["peer"] = np.tile(peer, steps)
        ev["seq"] = step_col * np.tile(per_step, steps) + np.tile(seq_in_step, steps)
        ev["in_bytes"] = np.tile(t.nbytes, steps)
        out_b = np.where(t.op == OP_CODES["reduce_scatter"], t.nbytes // max(dp, 1), t.nbytes)
        ev["out_bytes"] = np.tile(out_b, steps)
        a_abs = (arr[r] + step_start[:, None]).reshape(-1)
        ev["start_ns"] = a_abs + offsets[r]
        ev["duration_ns"] = (done[r] - arr[r]).reshape(-1)
        ev["step"] = step_col
        ev["flags"] = np.where(np.tile(t.kind, steps) == KINDS.index("dp"), 1, 0)
        # spans: step, data, forward, backward, optimizer
        sp = np.zeros(steps * 5, dtype=SPAN_DTYPE)
        comm = done[r] - arr[r]  # (steps, k)
        f_last = int(np.nonzero(t.phase == 1)[0][-1])
        b_last = int(np.nonzero(t.phase == 2)[0][-1])
        data_end = arr[r][:, 0] - t.gap_ns[0]
        bounds = [
            (np.zeros(steps, dtype=np.int64), end[r], None),
            (np.zeros(steps, dtype=np.int64), data_end, 0),
            (data_end, done[r][:, f_last], 1),
            (done[r][:, f_last], done[r][:, b_last], 2),
            (done[r][:, b_last], end[r], 3),
        ]
        for i, (lo, hi, ph) in enumerate(bounds):
            rows = sp[i::5]
            rows["kind"] = 0 if ph is None else 1
            rows["depth"] = 0 if ph is None else 1
            rows["name"] = SPAN_NAMES.index("step") if ph is None else ph
            rows["step"] = np.arange(steps)
            rows["start_ns"] = step_start + lo + offsets[r]
            rows["duration_ns"] = hi - lo
            in_ph = comm.sum(axis=1) if ph is None else comm[:, t.phase == ph].sum(axis=1)
            if ph == 0:
                in_ph = np.zeros(steps, dtype=np.int64)
            rows["cpu_ns"] = (hi - lo) - in_ph
            rows["tokens"] = 8192 if ph is None else 0
            rows["samples"] = 4 if ph is None else 0
            sp[i::5] = rows
        mem = np.zeros(steps, dtype=MEMORY_DTYPE)
        mem["step"] = np.arange(steps)
        mem["t_ns"] = step_start + end[r] + offsets[r]
        base = (20 + (4 if r == 0 else 0)) * 2**30
        mem["allocated"] = base + rng.integers(0, 2**28, size=steps)
        mem["reserved"] = base + 2**31
        mem["peak"] = base + 2**30 + rng.integers(0, 2**28, size=steps)
        mem["rss"] = 6 * 2**30
        mem["capacity"] = 80 * 2**30
        samples = []
        if r != 0 and exchange:
            t0 = int(BASE_NS - 50 * MS)
            for _ in range(10):
                d1, d2 = (int(x) for x in rng.integers(20 * US, 80 * US, size=2))
                samples.append([t0 + int(offsets[r]), t0 + d1, t0 + d1 + d2 + int(offsets[r])])
                t0 += d1 + d2 + 10 * US
        meta = RankMeta(
            rank=r,
            world_size=n,
            hostname=f"node{r // 8}",
            groups=my_groups,
            dtypes=["bfloat16"],
            labels=[],
            span_names=SPAN_NAMES,
            layout={"dp": dp, "tp": tp, "pp": pp},
            clock_sync=ClockSync(
                method="pg", ref_rank=0, rank=r, rounds=10, samples=samples, error=""
            ),
        )
        if fmt == "npz":
            write_rank_file(out, RankData(r, ev, sp, mem, meta))
        else:
            write_rank_segments(out, RankData(r, ev, sp, mem, meta))
    write_manifest(
        out,
        Manifest(
            world_size=n,
            command=f"synth_run.py --ranks {n} --collectives {collectives} --steps {steps}"
            f" --layout {dp}x{tp}x{pp} --template {template} --format {fmt}",
            layout={"dp": dp, "tp": tp, "pp": pp},
        ),
    )
    return {
        "ranks": n,
        "aligned_offsets_ns": (-offsets).tolist(),
        "events_per_rank": steps * k,
        "steps": steps,
        "layout": (dp, tp, pp),
        "groups": len(gindex),
        "slow_rank": slow_rank,
        "clock_offsets_ns": offsets.tolist(),
        "job_step_end_ns": end.max(axis=0).tolist(),
    }


def disk_usage(run_dir: Path) -> dict:
    """What the run takes on disk: files, bytes (apparent: what was written) and allocated
    (blocks: what the file system holds), and per rank folder / per rank meta (means)."""
    files = size = blocks = metas = meta_bytes = folders = 0
    for top in os.scandir(run_dir):
        entries = os.scandir(top.path) if top.is_dir() else [top]
        folders += top.is_dir() and top.name.startswith("rank")
        for e in entries:
            st = e.stat()
            files += 1
            size += st.st_size
            blocks += st.st_blocks * 512
            if e.name.endswith("-meta.json"):
                metas += 1
                meta_bytes += st.st_size
    return {
        "files": files,
        "bytes": size,
        "allocated": blocks,
        "rank_folders": folders,
        "meta_bytes_mean": meta_bytes / max(metas, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--collectives", type=int, default=1_000_000, help="per rank")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--slow-rank", type=int, default=None, help="default: the last rank")
    p.add_argument("--slow", type=float, default=0.30, help="extra forward compute (fraction)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", type=parse_layout, default=None, help="DPxTPxPP, e.g. 8x4x8")
    p.add_argument("--clock-ms", type=float, default=3.0, help="clock offsets up to ± this (ms)")
    p.add_argument("--no-exchange", action="store_true", help="no timestamp-exchange samples")
    p.add_argument(
        "--slow-all",
        action="store_true",
        help="the slow rank is slow in every phase (forward only by default: with large TP "
        "groups it then arrives last in under half of its collectives, and is not named)",
    )
    p.add_argument("--format", choices=("segments", "npz"), default="segments")
    p.add_argument("--template", choices=("default", "small"), default="default")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    info = write_run(
        a.out,
        a.ranks,
        a.collectives,
        a.steps,
        a.slow_rank,
        a.slow,
        a.seed,
        layout=a.layout,
        clock_ms=a.clock_ms,
        exchange=not a.no_exchange,
        slow_phases=(1, 2, 3) if a.slow_all else (1,),
        fmt=a.format,
        template=a.template,
    )
    short = {k: v for k, v in info.items() if "offsets" not in k and k != "job_step_end_ns"}
    print(f"wrote {a.out} in {time.perf_counter() - t0:.1f} s: {short}")
    du = disk_usage(a.out)
    events = info["events_per_rank"] * a.ranks
    print(
        f"on disk: {du['files']:,} files, {du['bytes'] / 1e6:,.1f} MB written "
        f"({du['allocated'] / 1e6:,.1f} MB allocated) for {events:,} events: "
        f"{du['bytes'] / events:.1f} B/event written ({du['allocated'] / events:.1f} allocated); "
        f"per rank {du['bytes'] / a.ranks:,.0f} B ({du['allocated'] / a.ranks:,.0f} allocated), "
        f"rank meta {du['meta_bytes_mean']:,.0f} B"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
