"""Loading a run directory: the merged manifest and every rank file that reads
(:func:`load_run` -> :class:`LoadedRun`). Missing or damaged ranks are listed, not fatal; so is a
missing or damaged ``manifest.json`` (the rank files are still read). A rank that died without
writing its final rank file is read from its crash-safe files when they are newer
(:mod:`meshprof.rundir.crashsafe`; its meta's ``recovered`` says so)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError, NoUsableRankFileError
from meshprof.layout import Layout
from meshprof.rundir.crashsafe import crashsafe_ranks, is_newer_than, recover_rank
from meshprof.rundir.manifest import merge_node_records, read_manifest, read_node_records
from meshprof.rundir.rankfile import RankData, load_rank_file
from meshprof.rundir.schema import MANIFEST, RANK_FILE_RE, Manifest, rank_file, resolve_layout


@dataclass(slots=True)
class LoadedRun:
    """A run directory: its manifest, the ranks that loaded, and the ones that did not."""

    path: Path
    manifest: Manifest
    """manifest.json merged with the node records (empty when the directory has none)."""
    ranks: dict[int, RankData]
    problems: dict[int, str]
    """rank -> why it is missing or damaged (ranks expected from the manifest's world size)."""
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
    shared: dict[tuple[str, int], list[Any]] | None = None,
    lean: bool = False,
    sample_limit: int | None = None,
    shared_text: dict[str, list[int]] | None = None,
) -> RankData | str:
    try:
        rd = load_rank_file(path, lean=lean, sample_limit=sample_limit, shared_ranks=shared_text)
    except MeshprofError as e:
        return str(e)
    if shared is not None:
        _share_members(rd, shared)
    return rd


def _share_members(rd: RankData, shared: dict[tuple[str, int], list[Any]]) -> None:
    """Every rank file lists the members of each of its groups: share one list per group
    (4,096 ranks each holding the world group's 4,096 members would be 16M Python ints)."""
    groups = rd.meta.groups or []
    for i, g in enumerate(groups):
        ranks = g.ranks
        if not isinstance(ranks, list):
            continue
        key = (str(g.name or ""), len(ranks))
        have = shared.setdefault(key, ranks)
        if have is not ranks and have == ranks:
            groups[i] = dataclasses.replace(g, ranks=have)  # (the meta's own list)


_THREADED_MIN_BYTES = 4 << 20
"""Rank files are read on a thread pool only when they average at least this size (bytes)."""


def _load_forked(
    paths: list[Path], lean: bool, sample_limit: int | None, processes: int
) -> list[RankData | str] | None:
    """The files loaded on ``processes`` forked workers (:mod:`meshprof.forking`), a chunk of
    files each, the loaded arrays pickled back; None where forking is unsafe. A chunk whose
    worker failed is loaded here."""
    from meshprof.forking import chunks, start

    def load_chunk(part: list[Path]) -> list[RankData | str]:
        shared: dict[tuple[str, int], list[Any]] = {}
        text: dict[str, list[int]] = {}
        return [_load_or_reason(p, shared, lean, sample_limit, text) for p in part]

    parts = chunks(paths, processes)
    forked = start(load_chunk, parts, processes)
    if forked is None:
        return None
    out: list[RankData | str] = []
    shared: dict[tuple[str, int], list[Any]] = {}
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
) -> list[RankData | str]:
    """Rank files are independent: large ones are read on a thread pool (one thread per core,
    at most 8), small ones one after the other. Measured on 2 shared cores (benchmarks/README.md,
    "Issue 12, third part"): the pool's CPU time / wall time stays at 1.0–1.4, the GIL serialising
    most of the per-file work (zip member reads, the lean copy's per-chunk calls, each file's
    JSON metadata); 1,024 small files took 1.4 s on 8 threads and 1.0 s on one (thread switches
    under the GIL), 8 files of 54 MB 0.8–1.1 s either way. ``processes`` > 1: small files are
    read on that many forked processes instead, where forking is safe (:func:`_load_forked`)."""
    shared: dict[tuple[str, int], list[Any]] = {}
    shared_text: dict[str, list[int]] = {}  # long member lists, parsed once (rankfile)
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
            got = _load_forked(paths, lean, sample_limit, processes)
            if got is not None:
                return got
        return [_load_or_reason(p, shared, lean, sample_limit, shared_text) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="meshprof-load") as pool:
        return list(
            pool.map(lambda p: _load_or_reason(p, shared, lean, sample_limit, shared_text), paths)
        )


def load_run(
    run_dir: str | Path,
    *,
    lean: bool = False,
    sample: float = 1.0,
    sample_reason: str = "",
    processes: int = 1,
) -> LoadedRun:
    """Load every rank file of a run directory. Missing or damaged ranks are listed in
    ``problems``; the rest still load. No usable rank at all raises
    :class:`~meshprof.errors.NoUsableRankFileError`.

    ``lean``: each rank's ``events`` keeps only its completed events and the columns the run
    report reads, in narrow dtypes (:func:`~meshprof.rundir.rankfile.load_rank_file`);
    ``sample`` < 1 (implies ``lean``): only a consistent sample of that fraction of the
    collectives, chosen by the recorder's (group, seq) hash (:mod:`meshprof.rundir.sampling`).
    ``processes`` > 1: many small rank files are read on that many forked processes where that
    is safe (Linux, no other thread running; the result is the same)."""
    from meshprof.rundir.sampling import threshold

    if not (0.0 < sample <= 1.0):
        raise MeshprofError(f"sample fraction must be in (0, 1], got {sample}")
    lean = lean or sample < 1.0
    limit = threshold(sample) if sample < 1.0 else None
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise MeshprofError(f"{run_dir}: no such directory")
    if not run_dir.is_dir():
        raise MeshprofError(f"{run_dir}: not a directory (expected a meshprof run directory)")
    manifest_state, manifest_problem = "ok", ""
    try:
        raw_manifest = read_manifest(run_dir)
    except MeshprofError as e:
        raw_manifest, manifest_state = Manifest(), "damaged"
        manifest_problem = f"{e}; the rank files are analysed without it"
    else:
        if not (run_dir / MANIFEST).exists():
            manifest_state = "missing"
            manifest_problem = f"{MANIFEST}: missing; the rank files are analysed without it"
    manifest = merge_node_records(raw_manifest, read_node_records(run_dir))
    ranks: dict[int, RankData] = {}
    problems: dict[int, str] = {}
    files = [
        (int(mm.group(1)), f)
        for f in sorted(run_dir.iterdir())
        if (mm := RANK_FILE_RE.match(f.name)) is not None
    ]
    for r, got in zip(
        (r for r, _ in files), _load_all([f for _, f in files], lean, limit, processes), strict=True
    ):
        if isinstance(got, RankData):
            ranks[r] = got
        else:
            problems[r] = got
    for r in crashsafe_ranks(run_dir):
        rec = recover_rank(run_dir, r)
        if rec is not None and is_newer_than(rec, ranks.get(r)):
            ranks[r] = rec
            problems.pop(r, None)
    world = int(manifest.world_size or 0)
    for rd in ranks.values():
        world = max(world, rd.world_size)
    world = max(world, max(list(ranks) + list(problems), default=-1) + 1)
    for r in range(world):
        if r not in ranks and r not in problems:
            problems[r] = f"{rank_file(run_dir, r).name}: missing"
    if not ranks:
        raise NoUsableRankFileError(run_dir, problems)
    return LoadedRun(
        path=run_dir,
        manifest=manifest,
        ranks=ranks,
        problems=problems,
        world_size=world,
        manifest_state=manifest_state,
        manifest_problem=manifest_problem,
        lean=lean,
        sample_fraction=float(sample),
        sample_reason=sample_reason if sample < 1.0 else "",
    )


__all__ = ["LoadedRun", "load_run"]
