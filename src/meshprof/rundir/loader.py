"""Loading a run: the merged manifest and every rank that reads (:func:`load_run` ->
:class:`LoadedRun`), from one run directory or from several (each node's own directory, when the
nodes share no file system). A rank is a folder of segments (:mod:`meshprof.rundir.segments`) or,
from older versions, a single rank file. Missing or damaged ranks are listed, not fatal; so is a
missing or damaged ``manifest.json`` (the ranks are still read). A rank that died without its
final write is read up to its last tick (its meta's ``recovered`` says so); what a rank recorded
but did not store (retention, a full disk) is said in :attr:`LoadedRun.storage_notes`."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError, NoUsableRankFileError
from meshprof.gc_pause import paused_gc
from meshprof.layout import Layout
from meshprof.records.members import Members
from meshprof.rundir.crashsafe import crashsafe_ranks, is_newer_than, recover_rank
from meshprof.rundir.manifest import merge_node_records, read_manifest, read_node_records
from meshprof.rundir.rank_problems import (
    ELSEWHERE,
    MISSING,
    RankProblems,
    RankSpan,
    missing_spans,
    split_elsewhere,
)
from meshprof.rundir.rankfile import RankData, load_rank_file
from meshprof.rundir.schema import (
    MANIFEST,
    Manifest,
    rank_dir,
    rank_entries,
    rank_file,
    resolve_layout,
)
from meshprof.rundir.segment_reader import load_rank_dir
from meshprof.rundir.storage_notes import StorageNote, storage_notes


@dataclass(slots=True)
class LoadedRun:
    """A run directory: its manifest, the ranks that loaded, and the ones that did not."""

    path: Path
    manifest: Manifest
    """manifest.json merged with the node records (empty when the directory has none)."""
    ranks: dict[int, RankData]
    problems: RankProblems
    """rank -> why it is missing or damaged (ranks expected from the manifest's world size):
    the damaged ones each, the missing ones as spans (:mod:`meshprof.rundir.rank_problems`; a
    plain dict given here is taken as damaged ranks)."""
    world_size: int
    manifest_state: str = "ok"
    """``manifest.json``: "ok", "missing" (e.g. a run recorded without ``meshprof run``) or
    "damaged". The rank files are analysed all the same, with an empty manifest."""
    manifest_problem: str = ""
    """Why ``manifest.json`` could not be used, in words ("" when it read)."""
    lean: bool = False
    """The ranks' ``events`` hold only the completed events' report columns
    (:data:`~meshprof.rundir.rankfile.LEAN_FIELDS`), see :func:`load_run`."""
    sample_fraction: float = 1.0
    """Fraction of the collectives loaded (a consistent (group, seq) sample below 1,
    :mod:`meshprof.rundir.sampling`)."""
    sample_reason: str = ""
    """Why the run was sampled, in words ("" when it was not)."""
    paths: tuple[Path, ...] = ()
    """Every directory read (``path`` is the first): one per node without a shared file
    system."""
    storage_notes: tuple[StorageNote, ...] = field(default=())
    """What ranks recorded but did not store: rotated out, dropped, or not written once the
    disk filled up."""

    def __post_init__(self) -> None:
        self.problems = RankProblems.of(self.problems)

    def is_elsewhere(self, rank: int) -> bool:
        """Rank ``rank`` is missing here because it ran on a node whose directory was not
        read (not a failure of the job)."""
        span = self.problems.span_of(rank)
        return span is not None and span.kind == ELSEWHERE

    def layout_of(self, rank: int) -> Layout | None:
        """The dp/tp/pp layout rank ``rank`` ran with (:func:`resolve_layout`)."""
        rd = self.ranks.get(rank)
        return resolve_layout(rd.meta if rd is not None else None, self.manifest)

    def layout(self) -> Layout | None:
        """The first loaded rank's layout that is known (ranks in order), else the manifest's."""
        for r in sorted(self.ranks):
            lay = self.layout_of(r)
            if lay is not None:
                return lay
        return resolve_layout(None, self.manifest)


def _load_or_reason(
    path: Path,
    shared: dict[Members, Members] | None = None,
    lean: bool = False,
    sample_limit: int | None = None,
    shared_text: dict[str, Members] | None = None,
    meta_only: bool = False,
) -> RankData | str:
    try:
        if path.is_dir():
            rd = load_rank_dir(
                path,
                lean=lean,
                sample_limit=sample_limit,
                shared_ranks=shared_text,
                meta_only=meta_only,
            )
        else:
            rd = load_rank_file(
                path, lean=lean or meta_only, sample_limit=sample_limit, shared_ranks=shared_text
            )
    except MeshprofError as e:
        return str(e)
    if shared is not None:
        _share_members(rd, shared)
    return rd


def _share_members(rd: RankData, shared: dict[Members, Members]) -> None:
    """One :class:`Members` per distinct group membership across the ranks: an irregular group
    is its list, and 4,096 ranks each holding their own copy of a large one would be millions
    of Python ints; a progression is three numbers, shared all the same (100,000 ranks × their
    groups' objects)."""
    groups = rd.meta.groups or []
    for g in groups:
        ranks = g.ranks
        if ranks is None:
            continue
        have = shared.setdefault(ranks, ranks)
        if have is not ranks:
            # (the record was just decoded for this rank alone: set in place, equal value;
            # dataclasses.replace costs 0.2 ms, a minute over 100,000 ranks' groups)
            object.__setattr__(g, "ranks", have)


_THREADED_MIN_BYTES = 4 << 20
"""Rank files are read on a thread pool only when they average at least this size (bytes)."""


def _load_forked(
    paths: list[Path], lean: bool, sample_limit: int | None, processes: int, meta_only: bool
) -> list[RankData | str] | None:
    """The files loaded on ``processes`` forked workers (:mod:`meshprof.forking`), a chunk of
    files each, the loaded arrays pickled back; None where forking is unsafe. A chunk whose
    worker failed is loaded here."""
    from meshprof.forking import chunks, start

    def load_chunk(part: list[Path]) -> list[RankData | str]:
        shared: dict[Members, Members] = {}
        text: dict[str, Members] = {}
        return [_load_or_reason(p, shared, lean, sample_limit, text, meta_only) for p in part]

    parts = chunks(paths, processes)
    forked = start(load_chunk, parts, processes)
    if forked is None:
        return None
    out: list[RankData | str] = []
    shared: dict[Members, Members] = {}
    for part, got in zip(parts, forked.results(), strict=True):
        loaded = load_chunk(part) if got is None else got
        for rd in loaded:
            if isinstance(rd, RankData):
                _share_members(rd, shared)  # (each chunk came back with its own lists)
        out.extend(loaded)
    return out


def _load_all(
    paths: list[Path],
    lean: bool = False,
    sample_limit: int | None = None,
    processes: int = 1,
    meta_only: bool = False,
) -> list[RankData | str]:
    """Rank files are independent: large ones are read on a thread pool (one thread per core,
    at most 8), small ones one after the other. Measured on 2 shared cores (benchmarks/README.md,
    "Issue 12, third part"): the pool's CPU time / wall time stays at 1.0–1.4, the GIL serialising
    most of the per-file work (zip member reads, the lean copy's per-chunk calls, each file's
    JSON metadata); 1,024 small files took 1.4 s on 8 threads and 1.0 s on one (thread switches
    under the GIL), 8 files of 54 MB 0.8–1.1 s either way. ``processes`` > 1: small files are
    read on that many forked processes instead, where forking is safe (:func:`_load_forked`)."""
    shared: dict[Members, Members] = {}
    shared_text: dict[str, Members] = {}  # long member lists, parsed once (rankfile)
    workers = min(len(paths), os.cpu_count() or 1, 8)
    if workers > 1:
        try:
            mean = sum(p.stat().st_size for p in paths) / len(paths)
        except OSError:
            mean = 0.0  # (a file that vanished is reported by its load below)
        if mean < _THREADED_MIN_BYTES:
            workers = 1
    if workers <= 1:
        if processes > 1 and len(paths) > 1:
            got = _load_forked(paths, lean, sample_limit, processes, meta_only)
            if got is not None:
                return got
        return [
            _load_or_reason(p, shared, lean, sample_limit, shared_text, meta_only) for p in paths
        ]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="meshprof-load") as pool:
        return list(
            pool.map(
                lambda p: _load_or_reason(p, shared, lean, sample_limit, shared_text, meta_only),
                paths,
            )
        )


def _check_dir(run_dir: Path) -> None:
    if not run_dir.exists():
        raise MeshprofError(f"{run_dir}: no such directory")
    if not run_dir.is_dir():
        raise MeshprofError(f"{run_dir}: not a directory (expected a meshprof run directory)")


def _entry_time(path: Path) -> float:
    """When a rank's data was last written (for the same rank in two directories)."""
    try:
        if path.is_dir():
            return max((p.stat().st_mtime for p in path.iterdir()), default=0.0)
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _read_manifests(dirs: list[Path]) -> tuple[Manifest, list[dict[str, Any]], str, str]:
    """The first readable manifest of ``dirs``, every node record (one per node id: the
    latest), the manifest's state and problem."""
    state, problem = "missing", ""
    base: Manifest | None = None
    run_ids: dict[str, Path] = {}
    for d in dirs:
        try:
            m = read_manifest(d)
        except MeshprofError as e:
            if base is None:
                state, problem = "damaged", f"{e}; the rank files are analysed without it"
            continue
        if not (d / MANIFEST).exists():
            continue
        if m.run_id:
            run_ids.setdefault(m.run_id, d)
        if base is None:
            base, state, problem = m, "ok", ""
    if len(run_ids) > 1:
        (a, da), (b, db) = list(run_ids.items())[:2]
        raise MeshprofError(
            f"{db} holds another run (run id {b}) than {da} (run id {a}): give the directories "
            "of one run"
        )
    if base is None and state == "missing":
        problem = f"{MANIFEST}: missing; the rank files are analysed without it"
    records: dict[str, dict[str, Any]] = {}
    for d in dirs:
        for rec in read_node_records(d):
            key = str(rec.get("node_id", ""))
            have = records.get(key)
            if have is None or _record_time(rec) >= _record_time(have):
                records[key] = rec
    merged = sorted(
        records.values(), key=lambda r: (int(r.get("node_rank") or 0), str(r.get("node_id", "")))
    )
    return base or Manifest(), merged, state, problem


def _record_time(rec: dict[str, Any]) -> int:
    return max(int(rec.get(k) or 0) for k in ("end_ns", "heartbeat_ns", "start_ns"))


@paused_gc()
def load_run(
    run_dir: str | Path | Sequence[str | Path],
    *,
    lean: bool = False,
    sample: float = 1.0,
    sample_reason: str = "",
    processes: int = 1,
    meta_only: bool = False,
    only_ranks: Collection[int] | None = None,
) -> LoadedRun:
    """Load every rank of a run directory, or of several directories of one run (each node's
    own: their ranks, node records and manifests are merged; a rank found in two is read from
    the one written last). Missing or damaged ranks are listed in ``problems``; the rest still
    load. No usable rank at all raises :class:`~meshprof.errors.NoUsableRankFileError`;
    directories of different runs (their manifests' run ids differ) raise
    :class:`~meshprof.errors.MeshprofError`.

    ``lean``: each rank's ``events`` keeps only its completed events and the columns the run
    report reads, in narrow dtypes (:func:`~meshprof.rundir.rankfile.load_rank_file`);
    ``sample`` < 1 (implies ``lean``): only a consistent sample of that fraction of the
    collectives, chosen by the recorder's (group, seq) hash (:mod:`meshprof.rundir.sampling`).
    ``processes`` > 1: many small rank files are read on that many forked processes where that
    is safe (Linux, no other thread running; the result is the same). ``meta_only``: the
    ranks' metas (and how a dead rank ended) without their rows, for the launcher's record.
    ``only_ranks``: read only these ranks' folders (or files), nothing of the others (a point
    query at 100,000 ranks reads one folder); ``problems`` then names only these."""
    from meshprof.rundir.sampling import threshold

    if not (0.0 < sample <= 1.0):
        raise MeshprofError(f"sample fraction must be in (0, 1], got {sample}")
    lean = lean or sample < 1.0
    limit = threshold(sample) if sample < 1.0 else None
    given = [run_dir] if isinstance(run_dir, str | Path) else list(run_dir)
    if not given:
        raise MeshprofError("no run directory given")
    dirs: list[Path] = []
    for d in map(Path, given):
        _check_dir(d)
        if all(d.resolve() != x.resolve() for x in dirs):
            dirs.append(d)
    raw_manifest, records, manifest_state, manifest_problem = _read_manifests(dirs)
    manifest = merge_node_records(raw_manifest, records)
    chosen: dict[int, Path] = {}
    wanted = None if only_ranks is None else {int(r) for r in only_ranks}
    for d in dirs:
        for r, p in _entries(d, wanted):
            have = chosen.get(r)
            if have is None or _entry_time(p) > _entry_time(have):
                chosen[r] = p
    ranks: dict[int, RankData] = {}
    problems: dict[int, str] = {}  # (the ranks whose file is there but unusable)
    files = sorted(chosen.items())
    for r, got in zip(
        (r for r, _ in files),
        _load_all([f for _, f in files], lean, limit, processes, meta_only),
        strict=True,
    ):
        if isinstance(got, RankData):
            ranks[r] = got
        else:
            problems[r] = got
    for d in dirs:
        for r in crashsafe_ranks(d):
            if wanted is not None and r not in wanted:
                continue
            rec = recover_rank(d, r)
            if rec is not None and is_newer_than(rec, ranks.get(r)):
                ranks[r] = rec
                problems.pop(r, None)
    world = _world_size(manifest, ranks, problems)
    present = set(ranks) | set(problems)
    if wanted is None:
        spans = missing_spans(world, present)  # (ranges: never one entry per missing rank)
    else:
        spans = [RankSpan(r, r, MISSING) for r in sorted(wanted - present)]
    if _nodes_unread(manifest, records):
        spans = split_elsewhere(spans, _listed(records))
    all_problems = RankProblems(problems, spans)
    if not ranks:
        raise NoUsableRankFileError(dirs[0], all_problems)
    return LoadedRun(
        path=dirs[0],
        manifest=manifest,
        ranks=ranks,
        problems=all_problems,
        world_size=world,
        manifest_state=manifest_state,
        manifest_problem=manifest_problem,
        lean=lean,
        sample_fraction=float(sample),
        sample_reason=sample_reason if sample < 1.0 else "",
        paths=tuple(dirs),
        storage_notes=() if meta_only else storage_notes(ranks),
    )


def _entries(run_dir: Path, wanted: set[int] | None) -> list[tuple[int, Path]]:
    """The rank entries of ``run_dir`` (:func:`rank_entries`), or only the ``wanted`` ranks'
    (looked up by name: the directory is not listed)."""
    if wanted is None:
        return rank_entries(run_dir)
    out: list[tuple[int, Path]] = []
    for r in sorted(wanted):
        folder, file = rank_dir(run_dir, r), rank_file(run_dir, r)
        if folder.is_dir():
            out.append((r, folder))
        elif file.is_file():
            out.append((r, file))
    return out


def _world_size(manifest: Manifest, ranks: dict[int, RankData], problems: dict[int, str]) -> int:
    """The world size: the largest the manifest, the ranks' metas and the ranks present say
    (each claim already bounded by :data:`~meshprof.records.members.MAX_WORLD_SIZE` when its
    record was read)."""
    world = int(manifest.world_size or 0)
    for rd in ranks.values():
        world = max(world, rd.world_size)
    return max(world, max(list(ranks) + list(problems), default=-1) + 1)


def _nodes_unread(manifest: Manifest, records: list[dict[str, Any]]) -> bool:
    """The job had more nodes (``nnodes``) than the node records read."""
    nnodes = str(manifest.nnodes or "")
    return nnodes.isdigit() and len(records) < int(nnodes)


def _listed(records: list[dict[str, Any]]) -> set[int]:
    """The ranks the node records read list (ranks of the nodes that were read)."""
    listed: set[int] = set()
    for rec in records:
        got = rec.get("ranks")
        if isinstance(got, list):
            listed |= {r for r in got if isinstance(r, int) and not isinstance(r, bool)}
    return listed


__all__ = ["LoadedRun", "load_run"]
