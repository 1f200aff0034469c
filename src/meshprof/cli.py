"""The ``meshprof`` command.

Each subcommand lives in its own module under :mod:`meshprof.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int`` as the handler.
To add a subcommand, add its module name to :data:`COMMANDS`.

Errors a user can cause raise :class:`meshprof.MeshprofError`; they become one line on stderr
and exit code 2 (argparse's own usage errors also exit with 2).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from meshprof.errors import MeshprofError

COMMANDS: tuple[str, ...] = (
    "version",
    "build_native",
    "summary",
    "run",
    "hang",
    "report",
    "diff",
    "top",
    "capture",
    "stacks",
    "export",
    "query",
    "collect",
    "bench",
    "doctor",
    "plan",
    "demo",
    "serve",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshprof",
        description="Profiler and performance monitor for distributed PyTorch.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"meshprof.commands.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        return int(args.func(args) or 0)
    except MeshprofError as e:
        print(f"meshprof {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
