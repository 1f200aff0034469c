"""``meshprof build-native``: build the native (C++) recorder now (CI, images) and say where it
is cached (once per host and torch build; see :mod:`meshprof.comm.native_ext`)."""

from __future__ import annotations

import argparse
import json
import sys
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build-native",
        help="build the native (C++) recorder now and print where it is cached",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def build_with_progress(prefix: str = "meshprof") -> str:
    """Build (or find cached) the native recorder, with a progress line on stderr while it
    compiles. Returns "" on success, else why it failed (one line)."""
    from meshprof.comm import native_ext
    from meshprof.errors import MeshprofError

    if native_ext.cached():
        return ""
    t0 = time.monotonic()
    print(
        f"{prefix}: building the native recorder once for this torch build "
        f"(~1 min) in {native_ext.build_dir()} ...",
        file=sys.stderr,
        flush=True,
    )
    try:
        native_ext.ensure_built()
    except MeshprofError as e:
        print(f"{prefix}: {e}", file=sys.stderr, flush=True)
        return str(e)
    print(f"{prefix}: built in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return ""


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
