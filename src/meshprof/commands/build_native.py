"""``meshprof build-native``: build the native (C++) recorder now (CI, images) and say where it
is cached (once per host and torch build; see :mod:`meshprof.comm.native_ext`)."""

from __future__ import annotations

import argparse
import json

from meshprof.launch.native_prep import build_with_progress


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build-native",
        help="build the native (C++) recorder now and print where it is cached",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshprof.comm import native_ext
    from meshprof.errors import MeshprofError

    error = build_with_progress("meshprof build-native")
    if not error:
        try:
            native_ext.load()  # it must also import, not just compile
        except MeshprofError as e:
            error = str(e)
    out = {
        "built": not error,
        "native_cache": str(native_ext.build_dir()),
        "library": str(native_ext.library_path()),
        "error": error,
    }
    if args.json:
        print(json.dumps(out))
    elif not error:
        print(f"native recorder: {out['library']}")
    return 0 if not error else 1
