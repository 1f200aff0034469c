"""Gathering the node-local run directories of one run into one (``meshprof collect``).

Without a shared file system each node's launcher writes its own directory: its node record,
its ranks' folders. They have distinct names, so gathering is copying: :func:`collect_into`
copies what the destination lacks (a segment that grew is appended to, not copied again: they
are append-only) and rewrites its ``manifest.json`` merged from every node record;
:func:`write_tar` streams a directory as a tar archive (``ssh node1 meshprof collect --tar DIR |
tar -x -C merged/``), for a node reachable only by a command. Directories of different runs
(their manifests name different run ids) are never mixed.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from meshprof.errors import MeshprofError
from meshprof.rundir.confine import make_dirs
from meshprof.rundir.manifest import (
    merge_node_records,
    read_manifest,
    read_node_records,
    write_manifest,
)
from meshprof.rundir.schema import MANIFEST
from meshprof.rundir.segments import RESERVE

_APPEND_ONLY = (".seg", ".jsonl")
"""Files that only grow: a longer source is appended to the copy, not copied again."""


def _skipped(rel: Path) -> bool:
    """Files never gathered: the manifest (merged instead), the disk reserve, the temporary
    files of atomic writes and of the launcher's write test."""
    name = rel.name
    return (
        rel == Path(MANIFEST)
        or name == RESERVE
        or (name.startswith(".") and (name.endswith(".tmp") or name.startswith(".meshprof-probe")))
    )


def run_files(run_dir: Path) -> Iterator[Path]:
    """Every file of a run directory that gathering copies, relative to it, sorted: regular
    files only (a symbolic link is not followed out of the directory, a FIFO or a link to a
    device is not read: ``/dev/zero`` would fill the destination)."""
    for root, dirs, names in os.walk(run_dir):
        dirs.sort()
        for name in sorted(names):
            rel = (Path(root) / name).relative_to(run_dir)
            try:
                regular = stat.S_ISREG(os.lstat(run_dir / rel).st_mode)
            except OSError:
                continue
            if regular and not _skipped(rel):
                yield rel


def _run_id(run_dir: Path) -> str:
    return str(read_manifest(run_dir, strict=False).run_id or "")


def check_one_run(dirs: list[Path]) -> str:
    """The run id the directories share ("" when none names one); MeshprofError when two
    name different runs."""
    seen: dict[str, Path] = {}
    for d in dirs:
        rid = _run_id(d)
        if rid:
            seen.setdefault(rid, d)
    if len(seen) > 1:
        (a, da), (b, db) = list(seen.items())[:2]
        raise MeshprofError(
            f"{db} holds another run (run id {b}) than {da} (run id {a}): runs are never mixed"
        )
    return next(iter(seen), "")


@dataclass(frozen=True, slots=True)
class Collected:
    """What :func:`collect_into` did."""

    files: int
    """Files copied or appended to."""
    bytes: int
    """Bytes written."""
    unchanged: int
    """Files already up to date in the destination."""


def _copy_new(src: Path, dst: Path) -> int:
    """Bring ``dst`` up to ``src``: append the new bytes of an append-only file, else copy it
    whole when it is newer. Bytes written (0: already up to date).

    The newest copy wins: a file several sources hold (a rank's live record, which the
    launchers relay into every node's ``live/``) is copied from the one written last, and a
    later collect copies nothing again (``copy2`` keeps the mtime)."""
    s = src.stat()
    try:
        d = dst.stat()
    except FileNotFoundError:
        d = None
    if d is not None and d.st_size == s.st_size and d.st_mtime >= s.st_mtime:
        return 0
    if (
        d is not None
        and d.st_mtime_ns >= s.st_mtime_ns
        and not (src.suffix in _APPEND_ONLY and d.st_size < s.st_size)
    ):
        return 0  # the copy is as new (another source's, written later)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink():  # (never written through)
        dst.unlink()
        d = None
    if d is not None and src.suffix in _APPEND_ONLY and 0 < d.st_size < s.st_size:
        with src.open("rb") as fi, dst.open("ab") as fo:
            fi.seek(d.st_size)
            n = s.st_size - d.st_size
            shutil.copyfileobj(fi, fo)
        shutil.copystat(src, dst)
        return n
    shutil.copy2(src, dst)
    return s.st_size


def collect_into(dest: Path, sources: list[Path]) -> Collected:
    """Copy what ``dest`` lacks from each of ``sources`` (the node-local directories of one
    run) and write ``dest/manifest.json`` merged from every node record."""
    for src in sources:
        if not src.is_dir():
            raise MeshprofError(f"{src}: no such directory (expected a meshprof run directory)")
        if dest.exists() and src.resolve() == dest.resolve():
            raise MeshprofError(f"{src}: is the destination itself")
    check_one_run([*sources, *([dest] if dest.is_dir() else [])])
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MeshprofError(f"{dest}: cannot create it ({e.strerror or e})") from None
    files = nbytes = unchanged = 0
    base = None
    for src in sources:
        if base is None and (src / MANIFEST).exists():
            base = read_manifest(src, strict=False)
        for rel in run_files(src):
            try:
                make_dirs(dest, (dest / rel).parent)  # (a folder of dest that is a link: refused)
                n = _copy_new(src / rel, dest / rel)
            except OSError as e:
                raise MeshprofError(f"{src / rel}: cannot copy it ({e.strerror or e})") from None
            if n:
                files, nbytes = files + 1, nbytes + n
            else:
                unchanged += 1
    if base is None:
        base = read_manifest(dest, strict=False)
    write_manifest(dest, merge_node_records(base, read_node_records(dest)))
    return Collected(files=files, bytes=nbytes, unchanged=unchanged)


def write_tar(run_dir: Path, out: IO[bytes]) -> int:
    """Stream ``run_dir`` (the files :func:`run_files` lists, and its manifest) as an
    uncompressed tar archive to ``out``; the number of files."""
    if not run_dir.is_dir():
        raise MeshprofError(f"{run_dir}: no such directory (expected a meshprof run directory)")
    n = 0
    with tarfile.open(fileobj=out, mode="w|") as tar:
        names = list(run_files(run_dir))
        if (run_dir / MANIFEST).exists():
            names.insert(0, Path(MANIFEST))
        for rel in names:
            try:
                tar.add(run_dir / rel, arcname=str(rel), recursive=False)
            except OSError:
                continue  # a file removed meanwhile (a rotated segment)
            n += 1
    return n


__all__ = ["Collected", "check_one_run", "collect_into", "run_files", "write_tar"]
