"""The cyclic garbage collector paused while a run is loaded and analysed.

Why: loading and analysing a large run creates millions of small objects (rank metas, group
records, per-rank results, their arrays' headers) and keeps them all; each time enough new
objects pile up the collector walks its generations, and its full collections walk everything
alive — ever more as the run loads. None of these objects is in a reference cycle, so reference
counting frees all that is dropped. Measured on the 100,000-rank synthetic run (2 cores,
benchmarks/README.md): ``load_run`` 115 s wall, 29 s of the main process' CPU, with the
collector; 77 s and 10 s without.

:func:`paused_gc` is a context manager and a decorator; it restores the collector's state on
exit (nested uses leave it off until the outermost ends) and never raises.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic collector off for the block (as it was before, after it)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


__all__ = ["paused_gc"]
