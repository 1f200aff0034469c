"""The native recorder made ready before ``meshprof run``'s workers start (built once per host
and torch build, :mod:`meshprof.comm.native_ext`), so they load it from the cache.

By default the torchrun process does it (:func:`prepare_in_torchrun`, asked by the launcher
through :data:`ENV_PREPARE`): it imports torch anyway, so the launcher never does (importing
torch costs ~2.5 s of CPU, and in the launcher those seconds came before torchrun even started).
Its environment is the workers', so a failed build's ``MESHPROF_NATIVE=0`` reaches every worker.
With ``--native`` the launcher builds it itself (:func:`prepare_native`): a failed build is an
error before anything starts.
"""

from __future__ import annotations

import os
import sys
import time

ENV_PREPARE = "MESHPROF_PREPARE_NATIVE"
"""Set (``1``) by the launcher in torchrun's environment: prepare the native recorder there."""


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


def prepare_native(force: bool) -> None:
    """Build the native recorder in this process, once, before the workers start (they then
    load it from the cache): by default wherever it can run (a failed build is one line on
    stderr and the workers record with Python, ``MESHPROF_NATIVE=0`` in this process's
    environment, which theirs inherits); with ``force`` (``--native``) a failed build is a
    :class:`~meshprof.errors.MeshprofError`."""
    from meshprof.config import native_from_env

    if force:
        import meshprof.comm.native_ext

        meshprof.comm.native_ext.load()  # MeshprofError: one line, exit code 2
        os.environ["MESHPROF_NATIVE"] = "1"
        return
    if native_from_env() is False:
        return
    from meshprof.comm.selection import native_supports_device

    if not native_supports_device():
        return
    if build_with_progress("meshprof run"):
        print("meshprof run: recording with the Python kernel", file=sys.stderr)
        os.environ["MESHPROF_NATIVE"] = "0"


def prepare_in_torchrun() -> None:
    """In the torchrun process, before it starts the workers: :func:`prepare_native` (default
    path) when the launcher asked for it; the request is not passed on to the workers."""
    if os.environ.pop(ENV_PREPARE, "") == "1":
        prepare_native(force=False)


__all__ = ["ENV_PREPARE", "build_with_progress", "prepare_in_torchrun", "prepare_native"]
