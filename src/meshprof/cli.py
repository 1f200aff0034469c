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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every subcommand, or with ``only`` (a name of
    :data:`COMMANDS`) that one alone — a command module imports what its command needs, so
    building every parser costs every command's imports (~0.5 s) for any one command."""
    parser = argparse.ArgumentParser(
        prog="meshprof",
        description="Profiler and performance monitor for distributed PyTorch.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS if only is None else (only,):
        module = importlib.import_module(f"meshprof.commands.{name}")
        module.register(sub)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The module name of the subcommand ``argv`` starts with (None: an option such as
    ``--help``, nothing, or no known command: the full parser then says what is wrong)."""
    if not argv:
        return None
    name = argv[0].replace("-", "_")
    return name if name in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    arg_list = list(argv) if argv is not None else sys.argv[1:]
    parser = build_parser(command_of(arg_list))
    args = parser.parse_args(arg_list)
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
