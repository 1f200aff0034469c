"""The per-rank step analysis's cost, and a bit-for-bit check of its results.

Measures what ``meshprof report`` spends per rank in :func:`meshprof.analyze.steps.analyze_recorded`
(through :func:`meshprof.report.stages.rank_analyses.analyze_ranks`, as the report's worker
processes call it): a run directory is loaded once (lean, as the report loads it), the ranks are
analysed once to warm up, then ``--repeat`` more times; the best pass is reported as CPU
milliseconds per rank (``time.process_time``). Then the cost of shipping the results back from a
worker: ``len(pickle.dumps(analyses))`` (bytes, and per rank) and the best of 5
``pickle.loads`` (ms for all ranks).

Equality: every rank's :class:`~meshprof.analyze.steps.StepAnalysis` is turned into a canonical
value (every field, recursively, with its type; floats by ``float.hex``, so -0.0, NaN and the
last bit count), of the given run directories (lean and, up to 64 ranks, fully loaded) and of a
corpus of randomized rank arrays (``--fuzz N`` cases: steps with and without phases, nested and
pipeline-chunk phases, unmeasured CPU time, incomplete events, unknown groups, warm-up and
skipped steps, layouts or none). ``--save DIR`` pickles them (one file per source);
``--check-against DIR`` compares with what an earlier ``--save`` wrote and exits 1 on any
difference (``--rel-tol`` allows a relative float difference, for changes that reorder a sum).

``--baseline-src SRC``: also time another checkout's ``src`` (e.g. ``git archive main src``
extracted) in a subprocess on the same run, alternating with this one, for a side-by-side figure.

    PYTHONPATH=src python benchmarks/rank_analysis_cost.py /tmp/run1k --save /tmp/ref
    PYTHONPATH=src python benchmarks/rank_analysis_cost.py /tmp/run1k --check-against /tmp/ref
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from meshprof.analyze.steps import StepAnalysis, StepOptions, analyze_recorded
from meshprof.events import EVENT_DTYPE, MEMORY_DTYPE, SPAN_DTYPE
from meshprof.layout import Layout
from meshprof.records.rank_meta import GroupRecord
from meshprof.report.stages.rank_analyses import analyze_ranks
from meshprof.rundir import load_run

FULL_LOAD_MAX_RANKS = 64
"""Run directories up to this many ranks are also checked fully loaded (not lean)."""


# ---------------------------------------------------------------- canonical values


def canonical(x: Any) -> Any:
    """``x`` as nested tuples of plain values, each tagged with its type's name (floats by
    ``float.hex``): two results are equal bit for bit iff their canonical values are."""
    t = type(x).__name__
    if isinstance(x, float):
        return (t, x.hex())
    if x is None or isinstance(x, (bool, int, str)):
        return (t, x)
    if isinstance(x, np.generic):
        return (t, canonical(x.item()))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (t, tuple((f.name, canonical(getattr(x, f.name))) for f in dataclasses.fields(x)))
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return (t, tuple((f, canonical(getattr(x, f))) for f in x._fields))
    if isinstance(x, dict):
        return (t, tuple((canonical(k), canonical(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (t, tuple(canonical(v) for v in x))
    raise TypeError(f"no canonical value for {t}")


def first_difference(a: Any, b: Any, rel_tol: float, path: str = "") -> str | None:
    """Where canonical values ``a`` and ``b`` differ (None: equal; floats within ``rel_tol``)."""
    if a == b:
        return None
    if (
        isinstance(a, tuple)
        and isinstance(b, tuple)
        and len(a) == len(b) == 2
        and a[0] == b[0] == "float"
        and isinstance(a[1], str)
    ):
        fa, fb = float.fromhex(a[1]), float.fromhex(b[1])
        if rel_tol > 0 and math.isclose(fa, fb, rel_tol=rel_tol, abs_tol=0.0):
            return None
        return f"{path}: {fa!r} != {fb!r}"
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        for i, (u, v) in enumerate(zip(a, b, strict=True)):
            label = u[0] if isinstance(u, tuple) and len(u) == 2 and isinstance(u[0], str) else i
            d = first_difference(u, v, rel_tol, f"{path}/{label}")
            if d is not None:
                return d
        return None
    return f"{path}: {str(a)[:200]} != {str(b)[:200]}"


# ---------------------------------------------------------------- sources of results


def run_results(run_dir: Path, lean: bool) -> dict[int, Any]:
    """Every rank's analysis of a run directory, canonical, by rank."""
    run = load_run(run_dir, lean=lean)
    return {r: canonical(a) for r, a in analyze_ranks(run).items()}


NAMES = [
    "data",
    "forward",
    "backward",
    "optimizer",
    "pp_forward",
    "pp_backward",
    "pp_backward_weight",
    "forward_backward",
    "schedule",
    "ckpt",
    "step",
    "dataloader",
    "misc",
]


def fuzz_case(
    seed: int,
) -> tuple[np.ndarray, list[str], np.ndarray, list[Any], np.ndarray, StepOptions]:
    """Randomized arrays of one rank and its options (the same for the same seed)."""
    rng = np.random.default_rng(seed)
    n_steps = int(rng.choice([0, 1, 2, 3, 5, 12]))
    pipeline = bool(rng.random() < 0.4)
    spans: list[tuple[Any, ...]] = []
    t = 1_000_000_000 + int(rng.integers(0, 1000))
    step_windows = []
    for k in range(n_steps):
        dur = (
            int(rng.choice([0, int(rng.integers(1, 50_000_000))]))
            if rng.random() < 0.05
            else int(rng.integers(1_000_000, 50_000_000))
        )
        cpu = -1 if rng.random() < 0.2 else int(rng.integers(0, max(dur, 1) * 1.2 + 1))
        step_no = k if rng.random() > 0.05 else max(k - 1, 0)
        spans.append(
            (0, 0, 0, 10, step_no, t, dur, int(rng.integers(0, 5000)), int(rng.integers(0, 9)), cpu)
        )
        step_windows.append((step_no, t, dur))
        if rng.random() > 0.1:  # phases
            n_ph = int(rng.integers(1, 6))
            cur = t + int(rng.integers(-1000, 100_000))
            for _ in range(n_ph):
                name = int(rng.choice([0, 1, 2, 3, 7, 8, 9, 11, 12, 20]))
                if pipeline and rng.random() < 0.4:
                    name = 8  # schedule
                pd = int(rng.integers(0, max(dur // 3, 2)))
                pcpu = -1 if rng.random() < 0.2 else int(rng.integers(0, pd * 1.3 + 2))
                p_step = step_no if rng.random() > 0.05 else step_no + 1
                spans.append((1, 0, 1, name, p_step, cur, pd, 0, 0, pcpu))
                if pipeline and (name == 8 or rng.random() < 0.3):  # chunks inside / beside
                    depth = 2 if name == 8 else 1
                    c0 = cur
                    for _c in range(int(rng.integers(1, 7))):
                        cd = int(rng.integers(0, max(pd // 4, 2)))
                        c0 += int(rng.integers(0, max(pd // 8, 2)))
                        cname = int(rng.choice([4, 5, 6]))
                        spans.append((1, 0, depth, cname, p_step, c0, cd, 0, 0, -1))
                        c0 += cd
                elif rng.random() < 0.3:  # a nested phase
                    spans.append(
                        (
                            1,
                            0,
                            2,
                            int(rng.choice([1, 2, 12])),
                            p_step,
                            cur + pd // 4,
                            pd // 2,
                            0,
                            0,
                            pd // 3,
                        )
                    )
                cur += pd + int(rng.integers(-pd // 10 - 1, max(dur // 10, 2)))
        t += dur + int(rng.integers(0, 2_000_000))
    if rng.random() < 0.3:  # a phase outside any step
        spans.append((1, 0, 1, 0, -1, t + 10, 1000, 0, 0, 500))
    order = rng.permutation(len(spans)) if rng.random() < 0.3 else np.arange(len(spans))
    sp = np.zeros(len(spans), dtype=SPAN_DTYPE)
    for i, j in enumerate(order.tolist()):
        sp[i] = spans[j]
    # groups and events
    layouts = [None, Layout(2, 2, 2), Layout(4, 1, 2), Layout(2, 2, 1), Layout(8, 1, 1)]
    layout = layouts[int(rng.integers(0, len(layouts)))]
    world = layout.world_size if layout is not None else 8
    group_defs: list[Any] = [
        {"ranks": list(range(world)), "desc": "default_pg"},
        {"ranks": [0, 1], "desc": "mesh_tp"},
        {"ranks": [0, 2], "desc": "mesh_dp"},
        {"ranks": [0, 4], "desc": "pp"},
        {"ranks": [0], "desc": "weird"},
    ]
    if rng.random() < 0.5:
        group_defs = [
            GroupRecord(name=str(i), desc=g["desc"], ranks=g["ranks"])
            for i, g in enumerate(group_defs)
        ]
    n_groups = int(rng.integers(1, len(group_defs) + 1))
    groups = group_defs[:n_groups]
    evs = []
    t_end = t
    t_begin = 1_000_000_000
    n_ev = int(rng.integers(0, 80)) if n_steps else int(rng.integers(0, 5))
    for _ in range(n_ev):
        s0 = int(rng.integers(t_begin - 5_000_000, max(t_end, t_begin + 1) + 5_000_000))
        d = -1 if rng.random() < 0.05 else int(rng.integers(0, 8_000_000))
        g = int(rng.integers(0, n_groups + (1 if rng.random() < 0.1 else 0)))
        evs.append(
            (
                0,
                0,
                0,
                0,
                g,
                -1,
                0,
                int(rng.integers(0, 1 << 20)),
                int(rng.integers(0, 1 << 20)),
                s0,
                d,
                -1,
            )
        )
    ev = np.zeros(len(evs), dtype=EVENT_DTYPE)
    for i, e in enumerate(evs):
        ev[i] = e
    mem_rows = []
    if rng.random() < 0.7:
        for k in range(int(rng.integers(1, n_steps + 3))):
            a = int(rng.integers(1 << 20, 1 << 30))
            cpu_like = rng.random() < 0.3
            mem_rows.append(
                (
                    k,
                    0,
                    a,
                    a,
                    a + int(rng.integers(0, 1 << 20)),
                    a if cpu_like else a * 2,
                    int(rng.choice([0, 1 << 34])),
                )
            )
    mem = np.zeros(len(mem_rows), dtype=MEMORY_DTYPE)
    for i, m in enumerate(mem_rows):
        mem[i] = m
    options = StepOptions(
        rank=int(rng.integers(0, 8)),
        layout=layout,
        schedule=str(rng.choice(["", "1F1B", "GPipe", "interleaved_1f1b"])),
        microbatches=int(rng.choice([0, 4, 8])),
        virtual_stages=int(rng.choice([1, 2])),
        flops_per_step=float(rng.choice([0.0, 1e12])) or None,
        peak_tflops=float(rng.choice([0.0, 300.0])) or None,
        warmup_steps=int(rng.choice([0, 1, 3])),
        skip_steps=((), (1,), (0, 2), (99,))[int(rng.integers(0, 4))],
    )
    return sp, list(NAMES), ev, groups, mem, options


def fuzz_results(n: int) -> dict[int, Any]:
    out = {}
    for seed in range(n):
        out[seed] = canonical(analyze_recorded(*fuzz_case(seed)))
    return out


def sources(dirs: list[Path], fuzz: int) -> Iterator[tuple[str, dict[int, Any]]]:
    """(label, canonical results by rank) of every source checked."""
    for d in dirs:
        yield f"{d.name}-lean", run_results(d, lean=True)
        if len(list(d.glob("rank*"))) <= FULL_LOAD_MAX_RANKS:
            yield f"{d.name}-full", run_results(d, lean=False)
    if fuzz:
        yield "fuzz", fuzz_results(fuzz)


# ---------------------------------------------------------------- cost


def time_per_rank(run_dir: Path, repeat: int) -> tuple[float, list[StepAnalysis]]:
    """Best CPU ms per rank of ``repeat`` passes over every rank (after one warm-up pass)."""
    run = load_run(run_dir, lean=True)
    analyze_ranks(run)
    best = math.inf
    out: dict[int, StepAnalysis] = {}
    for _ in range(repeat):
        t0 = time.process_time()
        out = analyze_ranks(run)
        best = min(best, time.process_time() - t0)
    return best * 1e3 / max(len(run.ranks), 1), [a for _, a in sorted(out.items())]


def pickle_cost(analyses: list[StepAnalysis]) -> tuple[int, float, float]:
    """(bytes, best dumps ms, best loads ms) of the analyses as one list."""
    blob = pickle.dumps(analyses, protocol=pickle.HIGHEST_PROTOCOL)
    dumps = loads = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        pickle.dumps(analyses, protocol=pickle.HIGHEST_PROTOCOL)
        dumps = min(dumps, time.perf_counter() - t0)
        t0 = time.perf_counter()
        back = pickle.loads(blob)
        loads = min(loads, time.perf_counter() - t0)
    assert [canonical(a) for a in back] == [canonical(a) for a in analyses], "pickle round trip"
    return len(blob), dumps * 1e3, loads * 1e3


def measure(run_dir: Path, repeat: int) -> dict[str, float]:
    ms, analyses = time_per_rank(run_dir, repeat)
    size, dumps, loads = pickle_cost(analyses)
    return {
        "ranks": len(analyses),
        "ms_per_rank": ms,
        "pickle_bytes": size,
        "pickle_bytes_per_rank": size / max(len(analyses), 1),
        "dumps_ms": dumps,
        "loads_ms": loads,
    }


def _print_cost(label: str, m: dict[str, float]) -> None:
    print(
        f"{label:>9}: {m['ms_per_rank']:.3f} ms CPU per rank ({int(m['ranks'])} ranks); pickle "
        f"{int(m['pickle_bytes']):,} B ({m['pickle_bytes_per_rank']:.0f} B/rank), dumps "
        f"{m['dumps_ms']:.1f} ms, loads {m['loads_ms']:.1f} ms",
        flush=True,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dirs", type=Path, nargs="*", help="run directories (checked; the first timed)")
    p.add_argument("--repeat", type=int, default=3, help="timed passes (best taken)")
    p.add_argument("--rounds", type=int, default=1, help="alternations with --baseline-src")
    p.add_argument("--fuzz", type=int, default=0, help="randomized ranks checked")
    p.add_argument("--save", type=Path, help="pickle the canonical results here")
    p.add_argument("--check-against", type=Path, help="compare with an earlier --save")
    p.add_argument("--rel-tol", type=float, default=0.0, help="float tolerance of the check")
    p.add_argument("--baseline-src", type=Path, help="another checkout's src, timed beside")
    p.add_argument("--no-time", action="store_true", help="only save / check")
    p.add_argument("--json", action="store_true", help="(internal) print the timing as JSON")
    args = p.parse_args()

    if args.json:
        print(json.dumps(measure(args.dirs[0], args.repeat)))
        return 0
    if args.dirs and not args.no_time:
        import meshprof

        print(f"timing {args.dirs[0]} (this code: {Path(meshprof.__file__).parent})", flush=True)
        for _ in range(args.rounds):
            if args.baseline_src is not None:
                env = dict(os.environ, PYTHONPATH=str(args.baseline_src.resolve()))
                cmd = [sys.executable, __file__, str(args.dirs[0]), "--json"]
                got = subprocess.run(
                    [*cmd, "--repeat", str(args.repeat)], env=env, check=True, capture_output=True
                )
                _print_cost("baseline", json.loads(got.stdout))
            _print_cost("this", measure(args.dirs[0], args.repeat))

    bad = 0
    if args.save or args.check_against:
        for label, got in sources(args.dirs, args.fuzz):
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / f"{label}.pkl").write_bytes(pickle.dumps(got))
                print(f"saved {label}: {len(got)} ranks", flush=True)
            if args.check_against:
                ref = pickle.loads((args.check_against / f"{label}.pkl").read_bytes())
                if label == "fuzz":  # the seeds both have
                    ref = {r: v for r, v in ref.items() if r in got}
                diffs = []
                if sorted(ref) != sorted(got):
                    diffs.append(f"ranks differ: {len(ref)} vs {len(got)}")
                for r in sorted(set(ref) & set(got)):
                    d = first_difference(ref[r], got[r], args.rel_tol)
                    if d is not None:
                        diffs.append(f"rank {r}{d}")
                bad += len(diffs)
                state = "IDENTICAL" if not diffs else f"{len(diffs)} DIFFER"
                tol = f" (rel tol {args.rel_tol:g})" if args.rel_tol else ""
                print(f"check {label}: {len(got)} ranks {state}{tol}", flush=True)
                for d in diffs[:5]:
                    print("   ", d)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
