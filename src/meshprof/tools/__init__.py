"""Engines of ``meshprof bench`` and ``meshprof doctor`` (their text is in :mod:`meshprof.render`),
and the helpers that run inside training: the hang watchdog and per-rank logging. The local rank
launcher is :mod:`meshprof.launch.spawn`."""

from __future__ import annotations
