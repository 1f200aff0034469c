"""Run directories holding every kind of file meshprof reads, built in this process by meshprof's
own writers (no job, no process group: a second or two), for the fuzz harness
(``tests/test_fuzz_files.py``) to damage.

``build_runs(root)`` writes ``root/seg`` (segments of two ranks, manifest, node record, live
records and alerts, posted requests, a finished capture with its Kineto traces, stacks answers,
watchdog and Flight Recorder dumps, torch.profiler traces under ``traces/``) and ``root/npz``
(the older one-file-per-rank format: the golden ``ddp_2rank`` run)."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"

KINDS: tuple[tuple[str, str], ...] = (
    ("manifest", r"manifest\.json"),
    ("node", r"nodes/[^/]+\.json"),
    ("meta", r"rank\d+/g\d+-meta\.json"),
    ("cursor", r"rank\d+/g\d+-cursor"),
    ("steps", r"rank\d+/g\d+-steps\.seg"),
    ("segment", r"rank\d+/g\d+-\d+\.seg"),
    ("npz", r"rank\d+\.npz"),
    ("live", r"live/rank\d+\.json"),
    ("alerts", r"live/alerts\.jsonl"),
    ("request", r"requests/[^/]+\.json"),
    ("capture", r"captures/[^/]+/(rank\d+|request)\.json"),
    ("kineto", r"(captures/[^/]+/[^/]+\.pt\.trace\.json\.gz|traces/[^/]+\.json(\.gz)?)"),
    ("stacks", r"stacks/[^/]+/rank\d+\.json"),
    ("hang", r"hang/(fr_)?rank\d+\.json"),
)
"""Every kind of file, by the pattern of its path in a run directory."""


def _feed(prof: Any, group: int, seqs: range, step: int, t0: int) -> None:
    """All_reduce events ``seqs`` (1 ms apart from ``t0``) of ``step``."""
    from meshprof.events import OP_CODES

    dt = prof.log.dtype_code("float32")
    for s in seqs:
        prof.log.append(
            (OP_CODES["all_reduce"], 0, dt, 0, group, -1, s, 4096, 4096, t0 + s * 1_000_000,
             200_000 + 1000 * s, step, None, None)
        )  # fmt: skip


def kineto_trace(rank: int, slow: bool, base_ns: int) -> dict[str, Any]:
    """A small torch.profiler trace: two steps of a few ops (one extra matmul when ``slow``)."""
    ev: list[dict[str, Any]] = []
    for s in range(2):
        t0 = 1000.0 + s * 10_000
        ev.append(_x("user_annotation", f"ProfilerStep#{50 + s}", t0, 10_000))
        ev += [
            _x("cpu_op", "aten::linear", t0 + 100, 500),
            _x("cpu_op", "aten::addmm", t0 + 150, 400),
            _x("cpu_op", "gloo:all_reduce", t0 + 5000, 300, tid=2),
            _x("user_annotation", "Optimizer.step#SGD.step", t0 + 6000, 300),
        ]
        if slow:
            ev.append(_x("cpu_op", "aten::mm", t0 + 700, 2900))
    return {"distributedInfo": {"rank": rank}, "baseTimeNanoseconds": base_ns, "traceEvents": ev}


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def build_segments(run: Path) -> Path:
    """Two ranks of twelve steps each, written tick by tick as a job's would be."""
    from meshprof.api import StepMonitor
    from meshprof.comm.recorder import CommProfiler
    from meshprof.config import ProfilerConfig
    from meshprof.events import GroupInfo
    from meshprof.rundir.writer import RankWriter

    ranks = []
    for r in (0, 1):
        prof = CommProfiler(ProfilerConfig(max_events=2000))
        mon = StepMonitor({"dp": 2, "tp": 1, "pp": 1}, profiler=prof, rank=r)
        meta = {"world_size": 2, "node_id": "n0", "layout": {"dp": 2, "tp": 1, "pp": 1}}
        w = RankWriter(run, prof, mon, interval_s=0, rank=r, extra_meta=meta, run_id="fuzz")
        g = prof.log.group_index(GroupInfo("0", "default_pg", (0, 1), "gloo"))
        ranks.append((prof, mon, w, g))
    for step in range(12):
        for r, (prof, mon, w, g) in enumerate(ranks):
            with mon.step(tokens=8), mon.phase("forward"):
                _feed(prof, g, range(step * 4, step * 4 + 4), step, time.time_ns())
                time.sleep(0.0005 * (1 + r))
            w.tick()
    for _, _, w, _ in ranks:
        w.stop(final_write=True)
    return run


def build_extras(run: Path) -> None:
    """The manifest, the node record and every file a running job adds."""
    from meshprof.comm.recorder import CommProfiler
    from meshprof.config import ProfilerConfig
    from meshprof.records.captures import (
        CapturedStep,
        CaptureRankStatus,
        CaptureRequest,
        CaptureState,
    )
    from meshprof.records.finding import Severity
    from meshprof.records.live import Alert, RankLive
    from meshprof.records.stacks import StacksRequest
    from meshprof.rundir.captures import capture_dir, trace_name, write_request_copy, write_status
    from meshprof.rundir.live import append_alert, write_rank_live
    from meshprof.rundir.manifest import write_manifest, write_node_record
    from meshprof.rundir.requests import write_request
    from meshprof.rundir.schema import Manifest
    from meshprof.rundir.stacks import write_rank_stacks
    from meshprof.session.thread_stacks import thread_stacks_now
    from meshprof.session.watchdog import build_dump

    now = time.time_ns()
    write_manifest(
        run,
        Manifest.from_dict(
            {
                "run_id": "fuzz",
                "world_size": 2,
                "nnodes": "1",
                "nproc_per_node": 2,
                "layout": {"dp": 2, "tp": 1, "pp": 1},
                "status": "ok",
                "exit_code": 0,
                "start_ns": now - 10**10,
                "end_ns": now,
                "rank_exit_codes": {"0": 0, "1": 0},
                "hosts": ["h0"],
            }
        ),
    )
    write_node_record(
        run,
        "n0",
        {"node_id": "n0", "node_rank": 0, "host": "h0", "ranks": [0, 1], "status": "ok",
         "exit_code": 0, "torchrun_exit_code": 0, "start_ns": now - 10**10, "end_ns": now,
         "rank_exit_codes": {"0": 0, "1": 0}, "hosts": ["h0"]},
    )  # fmt: skip
    for r in (0, 1):
        write_rank_live(
            run,
            RankLive(
                rank=r, updated_ns=now, interval_s=1.0, world_size=2, status="running",
                step=11, steps_done=12, step_ns=5_000_000, compute_ns=3_000_000,
            ),
        )  # fmt: skip
    append_alert(
        run,
        Alert(kind="straggler", title="rank 1 is slow", severity=Severity.WARNING, t_ns=now,
              ranks=(1,), value=0.3, threshold=0.1, unit="ratio"),
    )  # fmt: skip
    write_request(run, CaptureRequest(id="posted", ranks=(0, 1), steps=2, requested_ns=now))
    write_request(run, StacksRequest(id="posted", requested_ns=now))
    req = CaptureRequest(id="done1", ranks=(1, 0), steps=2, requested_ns=now - 10**9)
    write_request_copy(run, req)
    for r in (0, 1):
        path = capture_dir(run, req.id) / trace_name(r)
        path.write_bytes(gzip.compress(json.dumps(kineto_trace(r, r == 1, now)).encode()))
        write_status(
            run,
            CaptureRankStatus(
                id=req.id, rank=r, state=CaptureState.DONE, updated_ns=now, steps_asked=2,
                start_step=50, steps=(CapturedStep(50, now, now + 10**7),
                                      CapturedStep(51, now + 10**7, now + 2 * 10**7)),
                activities=("cpu",), trace=path.name, trace_bytes=path.stat().st_size,
            ),
        )  # fmt: skip
        write_rank_stacks(run, thread_stacks_now(r, "s1", 11))
    (run / "hang").mkdir()
    for r in (0, 1):
        data = build_dump(CommProfiler(ProfilerConfig(max_events=100)), "hang")
        data.update(rank=r, world_size=2)
        (run / "hang" / f"rank{r}.json").write_text(json.dumps(data))
    (run / "hang" / "fr_rank1.json").write_text(json.dumps(_fr_dump()))
    traces = run / "traces"
    traces.mkdir()
    for r in (0, 1):
        (traces / f"rank{r}.json").write_text(json.dumps(kineto_trace(r, r == 1, now)))


def _fr_dump() -> dict[str, Any]:
    """A Flight Recorder JSON dump of one rank: two all_reduces, the second still running."""
    entries = [
        {
            "process_group": ["0", "default_pg"],
            "profiling_name": "gloo:all_reduce",
            "collective_seq_id": s,
            "input_sizes": [[1024]],
            "input_dtypes": ["Float"],
            "output_sizes": [[1024]],
            "output_dtypes": ["Float"],
            "state": "scheduled",
            "is_p2p": False,
            "retired": s == 1,
        }
        for s in (1, 2)
    ]
    return {
        "version": "2.4",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {"0": {"last_enqueued_collective": 2, "last_completed_collective": 1}},
        "entries": entries,
    }


def build_runs(root: Path) -> dict[str, Path]:
    """``{"seg": root/seg, "npz": root/npz}`` (see the module docstring)."""
    seg = build_segments(root / "seg")
    build_extras(seg)
    npz = root / "npz"
    shutil.copytree(DATA / "ddp_2rank", npz)
    return {"seg": seg, "npz": npz}


__all__ = ["KINDS", "build_runs", "kineto_trace"]
