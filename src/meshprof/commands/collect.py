"""``meshprof collect -o DEST DIR [DIR ...]`` / ``meshprof collect --tar DIR``: gather the
node-local run directories of one run (:mod:`meshprof.rundir.gather`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from meshprof.errors import MeshprofError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collect",
        help="gather the node-local run directories of one run into one (copy or tar stream)",
        description="Gather the run directories each node wrote on its own disk into one "
        "(-o DEST): what DEST lacks is copied, a segment that grew is appended to, and DEST's "
        "manifest is merged from every node's record; run it again while the job runs to bring "
        "DEST up to date. --tar streams one directory as a tar archive on stdout instead (ssh "
        "node1 meshprof collect --tar DIR | tar -x -C DEST). Directories of different runs are "
        "refused. meshprof report DIR1 DIR2 ... reads the directories without gathering them.",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run directories of one run")
    p.add_argument("-o", "--output", metavar="DEST", help="the directory to gather into")
    p.add_argument(
        "--tar", action="store_true", help="write DIR as an uncompressed tar stream on stdout"
    )
    p.add_argument("--json", action="store_true", help="print what was copied as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshprof.rundir.gather import collect_into, write_tar

    sources = [Path(d) for d in args.dirs]
    if args.tar:
        if args.output or len(sources) != 1:
            raise MeshprofError("--tar streams one directory to stdout (no -o)")
        if sys.stdout.isatty():
            raise MeshprofError("--tar writes a tar archive: pipe it (… | tar -x -C DEST)")
        sys.stdout.flush()
        write_tar(sources[0], sys.stdout.buffer)
        return 0
    if not args.output:
        raise MeshprofError("give the destination: meshprof collect -o DEST DIR [DIR ...]")
    got = collect_into(Path(args.output), sources)
    if args.json:
        out = {"dest": args.output, "files": got.files, "bytes": got.bytes}
        print(json.dumps({**out, "unchanged": got.unchanged}))
    else:
        print(
            f"collected {len(sources)} directories into {args.output}: {got.files} files "
            f"({got.bytes:,} bytes) copied, {got.unchanged} already up to date"
        )
    return 0
