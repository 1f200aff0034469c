"""``meshprof doctor``: is this distributed setup healthy? Each check gives ✓ or ✗ and the reason.

Every rank runs the same checks in the same order; every check is wrapped in try/except and
bounded by a timeout (gloo's process-group timeout, ``monitored_barrier(timeout=)``,
``work.wait(timeout)``), so a dead or misconfigured peer gives ✗ with the reason, never a hang.
Results of rank 0 describe the job; each rank also appends its results to ``result_dir`` (when
given) as it goes, so the parent of ``--nproc`` ranks still has them when a rank dies.
:mod:`meshprof.render.doctor` prints the checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

ENV_PREFIXES = (
    "NCCL_",
    "GLOO_",
    "TORCH_",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
)


@dataclass(frozen=True, slots=True)
class Check:
    """The outcome of one check."""

    name: str
    """Short name, e.g. "connectivity"."""
    ok: bool
    """True for ✓."""
    detail: str
    """What was found, or why it failed, in words."""
    rank: int = 0
    """The rank that reported it."""
    values: dict[str, Any] = field(default_factory=dict)
    """Numbers behind the detail (latencies in µs, bytes, ...)."""
    skipped: bool = False
    """True when the check could not run (an earlier check failed); counts as ✗."""


@dataclass(frozen=True, slots=True)
class DoctorConfig:
    """Doctor settings."""

    backend: str = "gloo"
    """Backend of the default process group."""
    timeout_s: float = 10.0
    """Per-check timeout (process-group start, each collective, each pair)."""
    skew_limit_ms: float = 50.0
    """Clock difference between ranks above which the clock check fails (ms)."""
    imbalance_limit: float = 1.5
    """Slowest / fastest compute probe above which the load-balance check fails."""
    min_free_fraction: float = 0.05
    """Free device memory below this fraction of the total fails the memory check."""
    result_dir: str | None = None
    """Folder where each rank appends its results (JSON lines) as it goes."""


class _Ctx:
    def __init__(self, rank: int, ws: int, cfg: DoctorConfig) -> None:
        self.rank, self.ws, self.cfg = rank, ws, cfg
        self.checks: list[Check] = []
        self.file = Path(cfg.result_dir) / f"rank{rank}.jsonl" if cfg.result_dir else None

    def add(self, name: str, ok: bool, detail: str, skipped: bool = False, **values: Any) -> Check:
        c = Check(name, ok, detail, self.rank, values, skipped)
        self.checks.append(c)
        if self.file is not None:
            try:
                self.file.parent.mkdir(parents=True, exist_ok=True)
                with self.file.open("a") as f:
                    f.write(json.dumps(asdict(c), default=str) + "\n")
            except OSError:
                pass
        return c


def _wait(work: Any, timeout_s: float) -> None:
    if not work.wait(timeout=timedelta(seconds=timeout_s)):
        raise TimeoutError(f"no completion within {timeout_s:.0f} s")


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def _gather(
    dist: Any, torch: Any, values: list[float], ws: int, timeout_s: float
) -> list[list[float]]:
    local = torch.tensor(values, dtype=torch.float64)
    table = [torch.zeros_like(local) for _ in range(ws)]
    _wait(dist.all_gather(table, local, async_op=True), timeout_s)
    return [t.tolist() for t in table]


def check_environment(ctx: _Ctx) -> None:
    import torch

    nccl = ""
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception as e:
        nccl = f"unavailable ({_err(e)})"
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    ctx.add(
        "environment",
        True,
        f"torch {torch.__version__}, CUDA {'yes' if torch.cuda.is_available() else 'no'}"
        f"{', NCCL ' + nccl if nccl else ''}; {len(env)} relevant variables set",
        torch=torch.__version__,
        nccl=nccl,
        cuda=torch.cuda.is_available(),
        env=env,
    )


def check_native(ctx: _Ctx) -> None:
    """The native recorder on this host: built or not, why a build failed, the warnings its
    build logged (``build.log``, kept out of the training's output) and what torch logged when
    its extension tools were imported (e.g. "No CUDA runtime is found")."""
    from meshprof.comm import native_ext

    failure = native_ext.last_failure()
    built = native_ext.cached()
    warns = native_ext.build_warnings()
    notes = list(native_ext.IMPORT_MESSAGES)
    if built:
        detail = f"built in {native_ext.build_dir()}"
    elif failure:
        detail = f"the build failed: {failure}"
    else:
        detail = (
            "not built yet (the first run builds it in the background; now: meshprof build-native)"
        )
    if warns:
        detail += f"; {len(warns)} warning line(s) in {native_ext.LOG}, first: {warns[0][:160]}"
    if notes:
        detail += f"; torch said: {notes[0][:160]}"
    ctx.add(
        "native recorder",
        built or not failure,
        detail,
        built=built,
        build_warnings=warns,
        torch_messages=notes,
    )


def check_init(ctx: _Ctx) -> bool:
    import torch.distributed as dist

    cfg = ctx.cfg
    t0 = time.perf_counter()
    try:
        if not dist.is_initialized():
            dist.init_process_group(cfg.backend, timeout=timedelta(seconds=cfg.timeout_s))
        ctx.add(
            f"process group ({cfg.backend})", True, f"started in {time.perf_counter() - t0:.2f} s"
        )
        return True
    except Exception as e:
        ctx.add(
            f"process group ({cfg.backend})",
            False,
            f"could not start within {cfg.timeout_s:.0f} s: {_err(e)} (a peer did not join, or MASTER_ADDR/PORT is wrong)",
        )
        return False


def check_world(ctx: _Ctx) -> None:
    import torch
    import torch.distributed as dist

    ws, rank = dist.get_world_size(), dist.get_rank()
    if ws != ctx.ws or rank != ctx.rank:
        ctx.add(
            "world",
            False,
            f"expected rank {ctx.rank} of {ctx.ws}, the group says rank {rank} of {ws}",
        )
        return
    dist.monitored_barrier(
        timeout=timedelta(seconds=ctx.cfg.timeout_s), wait_all_ranks=True
    ) if dist.get_backend() == "gloo" else None
    ranks = sorted(int(r[0]) for r in _gather(dist, torch, [float(rank)], ws, ctx.cfg.timeout_s))
    ok = ranks == list(range(ws))
    ctx.add(
        "world",
        ok,
        f"world size {ws}, ranks {ranks}" + ("" if ok else ": ranks are missing or duplicated"),
    )


def check_connectivity(ctx: _Ctx) -> None:
    """Every pair (i, j), one after another: i sends to j, j sends back; latency = round trip / 2."""
    import torch
    import torch.distributed as dist

    rank, ws, to = ctx.rank, ctx.ws, ctx.cfg.timeout_s
    buf = torch.zeros(1)
    lat: dict[str, float] = {}
    failed: list[str] = []
    for i in range(ws):
        for j in range(i + 1, ws):
            if rank not in (i, j):
                continue
            other = j if rank == i else i
            try:
                best = float("inf")
                for _ in range(5):
                    t0 = time.perf_counter_ns()
                    if rank == i:
                        _wait(dist.isend(buf, other), to)
                        _wait(dist.irecv(buf, other), to)
                    else:
                        _wait(dist.irecv(buf, other), to)
                        _wait(dist.isend(buf, other), to)
                    best = min(best, (time.perf_counter_ns() - t0) / 2e3)
                lat[f"{i}-{j}"] = best
            except Exception as e:
                failed.append(f"{i}↔{j}: {_err(e)}")
                break
    # rank 0 learns the others' pairs through a collective (bounded by the timeout)
    vals = [lat.get(f"{min(rank, o)}-{max(rank, o)}", -1.0) for o in range(ws)]
    try:
        table = _gather(dist, torch, vals, ws, to)
    except Exception as e:
        ctx.add(
            "connectivity",
            False,
            f"could not collect the pair results: {_err(e)}; {'; '.join(failed)}",
        )
        return
    bad = [
        f"{a}↔{b}"
        for a in range(ws)
        for b in range(a + 1, ws)
        if table[a][b] < 0 or table[b][a] < 0
    ]
    us = [table[a][b] for a in range(ws) for b in range(a + 1, ws) if table[a][b] >= 0]
    if bad or failed:
        ctx.add(
            "connectivity",
            False,
            f"send/recv failed between {', '.join(bad)}"
            + (f" ({'; '.join(failed)})" if failed else ""),
        )
    else:
        ctx.add(
            "connectivity",
            True,
            f"all {len(us)} pairs answer; one-way latency min {min(us, default=0):.0f} µs, "
            f"max {max(us, default=0):.0f} µs",
            latency_us={f"{a}-{b}": table[a][b] for a in range(ws) for b in range(a + 1, ws)},
        )


def _bounded(fn: Any, timeout_s: float) -> str:
    """Run ``fn()`` in a daemon thread for at most ``timeout_s``: "" on success, else the reason.

    Blocking collectives (gather, scatter, batch_isend_irecv) take no timeout argument; a thread
    keeps the doctor itself from blocking on them."""
    import threading

    result: list[str] = []

    def target() -> None:
        try:
            fn()
            result.append("")
        except Exception as e:
            result.append(_err(e))

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        return f"no completion within {timeout_s:.0f} s"
    return result[0] if result else "no result"


def check_collectives(ctx: _Ctx) -> None:
    """Every op once on 4 KiB of rank-dependent values, compared exactly with the expected
    result (the same cases as ``meshprof bench``)."""
    import torch
    import torch.distributed as dist

    from meshprof.tools.bench import ALL_OPS, CollectiveCase, modes_of

    bad: list[str] = []
    for op in ALL_OPS:
        mode = modes_of(op, ("out-of-place",))[0]
        try:
            case = CollectiveCase(
                torch, dist, op, mode, 4096, torch.float32, torch.device("cpu"), ctx.rank, ctx.ws
            )
            why = _bounded(case.run, ctx.cfg.timeout_s)
            if why:
                bad.append(f"{op} ({why})")
                if "no completion" in why:
                    break  # the group is unusable after a stuck collective
                continue
            total = _gather(dist, torch, [float(case.wrong())], ctx.ws, ctx.cfg.timeout_s)
            w = int(sum(x[0] for x in total))
            if w:
                bad.append(f"{op} ({w} wrong elements)")
        except Exception as e:
            bad.append(f"{op} ({_err(e)})")
            break
    detail = (
        f"all {len(ALL_OPS)} ops gave correct results" if not bad else "failed: " + "; ".join(bad)
    )
    ctx.add("collectives", not bad, detail)


def check_clock(ctx: _Ctx) -> None:
    """Rank 0 sends its time to each rank and gets theirs back; offset from the round trip with
    the smallest duration (NTP's estimate)."""
    import torch
    import torch.distributed as dist

    rank, ws, to = ctx.rank, ctx.ws, ctx.cfg.timeout_s
    offsets = [0.0] * ws
    buf = torch.zeros(1, dtype=torch.float64)
    for r in range(1, ws):
        if rank not in (0, r):
            continue
        best_rtt, best_off = float("inf"), 0.0
        for _ in range(8):
            if rank == 0:
                t0 = time.time_ns()
                _wait(dist.isend(torch.tensor([float(t0)], dtype=torch.float64), r), to)
                _wait(dist.irecv(buf, r), to)
                t1 = time.time_ns()
                if t1 - t0 < best_rtt:
                    best_rtt, best_off = t1 - t0, buf.item() - (t0 + t1) / 2
            else:
                _wait(dist.irecv(buf, 0), to)
                _wait(dist.isend(torch.tensor([float(time.time_ns())], dtype=torch.float64), 0), to)
        if rank == 0:
            offsets[r] = best_off / 1e6
    skew = _gather(dist, torch, offsets, ws, to)[0]
    worst = max(range(ws), key=lambda r: abs(skew[r]))
    ok = abs(skew[worst]) <= ctx.cfg.skew_limit_ms
    ctx.add(
        "clock skew",
        ok,
        f"largest offset from rank 0: rank {worst} {skew[worst]:+.3f} ms"
        + (
            ""
            if ok
            else f" (> {ctx.cfg.skew_limit_ms:g} ms: synchronize clocks (NTP/PTP); traces will misalign)"
        ),
        offsets_ms=skew,
    )


def check_memory(ctx: _Ctx) -> None:
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available() and ctx.cfg.backend == "nccl":
        free, total = torch.cuda.mem_get_info()
        kind = "device"
    else:
        import psutil

        vm = psutil.virtual_memory()
        free, total = vm.available, vm.total
        kind = "host"
    table = _gather(dist, torch, [float(free), float(total)], ctx.ws, ctx.cfg.timeout_s)
    low = [r for r, (f, t) in enumerate(table) if t > 0 and f / t < ctx.cfg.min_free_fraction]
    lo = min(range(ctx.ws), key=lambda r: table[r][0])
    detail = f"{kind} memory free: least on rank {lo}: {table[lo][0] / 2**30:.1f} of {table[lo][1] / 2**30:.1f} GiB"
    if low:
        detail += f"; ranks {low} have < {ctx.cfg.min_free_fraction:.0%} free"
    ctx.add("free memory", not low, detail, free_bytes=[int(f) for f, _ in table])


PROBE_ROUNDS = 5
"""Probes per rank in the compute-balance check; its best counts."""


def check_compute(ctx: _Ctx) -> None:
    """The same fixed matmul on every rank: the slowest / fastest ratio shows load imbalance."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and ctx.cfg.backend == "nccl"
    dev = torch.device("cuda") if cuda else torch.device("cpu")
    a = torch.randn(256, 256, device=dev, generator=None)
    a @ a

    def probe() -> float:
        """µs of 10 matmuls (the device's time on CUDA)."""
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(10):
            a @ a
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / 1e3

    best = float("inf")
    if cuda:  # one device per rank: all at once
        for _ in range(PROBE_ROUNDS):
            best = min(best, probe())
    else:
        # CPU ranks share the host's cores: one rank at a time, so they do not slow each other,
        # in rounds, so that a burst of another process's load on the host falls on one round of
        # every rank rather than on all of one rank's probes (the best round counts)
        for _ in range(PROBE_ROUNDS):
            for r in range(ctx.ws):
                _gather(dist, torch, [0.0], ctx.ws, ctx.cfg.timeout_s)  # a barrier with a timeout
                if r == ctx.rank:
                    best = min(best, probe())
    times = [t[0] for t in _gather(dist, torch, [best], ctx.ws, ctx.cfg.timeout_s)]
    slow, fast = (
        max(range(ctx.ws), key=lambda r: times[r]),
        min(range(ctx.ws), key=lambda r: times[r]),
    )
    ratio = times[slow] / times[fast] if times[fast] > 0 else 1.0
    ok = ratio <= ctx.cfg.imbalance_limit
    ctx.add(
        "compute balance",
        ok,
        f"probe (10 × 256² matmul) {times[fast]:.0f} µs on rank {fast} … {times[slow]:.0f} µs "
        f"on rank {slow} ({ratio:.2f}×)" + ("" if ok else ": ranks are unevenly loaded"),
        probe_us=times,
    )


CHECKS = (
    check_world,
    check_connectivity,
    check_collectives,
    check_clock,
    check_memory,
    check_compute,
)


def doctor_rank(rank: int, world_size: int, cfg: DoctorConfig) -> list[Check]:
    """Run every check on this rank (starting the process group itself when needed)."""
    import torch.distributed as dist

    ctx = _Ctx(rank, world_size, cfg)
    try:
        check_environment(ctx)
    except Exception as e:
        ctx.add("environment", False, _err(e))
    try:
        check_native(ctx)
    except Exception as e:
        ctx.add("native recorder", False, _err(e))
    started_here = not dist.is_initialized()
    if not check_init(ctx):
        for fn in CHECKS:
            ctx.add(
                fn.__name__.removeprefix("check_").replace("_", " "),
                False,
                "not run: no process group",
                skipped=True,
            )
        return ctx.checks
    try:
        for fn in CHECKS:
            try:
                fn(ctx)
            except Exception as e:
                ctx.add(fn.__name__.removeprefix("check_").replace("_", " "), False, _err(e))
    finally:
        if started_here:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    return ctx.checks


def merge(
    per_rank: dict[int, list[Check]], world_size: int, failures: dict[int, str]
) -> list[Check]:
    """Rank 0's view of the job, plus ✗ for ranks that reported a failure rank 0 did not see, or
    that gave no result."""
    base = list(per_rank.get(0, []))
    names = {c.name for c in base if not c.ok}
    for r in sorted(per_rank):
        if r == 0:
            continue
        for c in per_rank[r]:
            if not c.ok and not c.skipped and c.name not in names:
                base.append(c)
                names.add(c.name)
    for r in range(world_size):
        if r not in per_rank or not per_rank[r]:
            base.append(
                Check(
                    f"rank {r}", False, failures.get(r, "gave no result (died or never started)"), r
                )
            )
        elif r in failures:
            base.append(Check(f"rank {r}", False, failures[r], r))
    return base


def read_results(result_dir: str | os.PathLike[str], world_size: int) -> dict[int, list[Check]]:
    out: dict[int, list[Check]] = {}
    for r in range(world_size):
        p = Path(result_dir) / f"rank{r}.jsonl"
        if not p.exists():
            continue
        checks = []
        for line in p.read_text().splitlines():
            try:
                checks.append(Check(**json.loads(line)))
            except (ValueError, TypeError):
                continue
        out[r] = checks
    return out


__all__ = ["Check", "DoctorConfig", "doctor_rank", "merge", "read_results"]
