"""The ``meshprof`` subcommands, one module each with ``register(subparsers)`` (listed in
:data:`meshprof.cli.COMMANDS`), and :mod:`.options`, the options several of them share."""

from __future__ import annotations
