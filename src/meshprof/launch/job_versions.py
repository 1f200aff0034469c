"""The versions the run's manifest records (``meshprof version --json``: meshprof, torch, the
backends, the recorder the workers will use), said by the torchrun process.

The launcher of ``meshprof run`` does not import torch (~2.5 s of CPU, which it used to spend
before torchrun even started); the torchrun process imports it anyway and has the workers'
environment, so it writes the versions to the file :data:`ENV_VERSIONS` names, and the launcher
puts them in the manifest as soon as they are there (:func:`read_versions`). When torchrun ends
without saying them, the launcher finds them itself (:func:`versions_here`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV_VERSIONS = "MESHPROF_VERSIONS_FILE"
"""Set by the launcher in torchrun's environment: where torchrun writes the versions."""


def versions_here() -> dict[str, Any]:
    """``meshprof version --json`` of this process; an ``error`` entry when it cannot say (a
    manifest without versions beats no run at all)."""
    try:
        from meshprof.commands.version import versions

        return versions()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def report_versions() -> None:
    """In the torchrun process: write :func:`versions_here` where the launcher asked (the
    request is not passed on to the workers); never raises."""
    path = os.environ.pop(ENV_VERSIONS, "")
    if not path:
        return
    try:
        from meshprof.rundir.atomic import atomic_write_text

        atomic_write_text(Path(path), json.dumps(versions_here()), fsync=False)
    except Exception:  # the launcher finds them itself
        return


def read_versions(path: Path) -> dict[str, Any] | None:
    """What torchrun wrote to ``path``; None while (or when) it has not."""
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


__all__ = ["ENV_VERSIONS", "read_versions", "report_versions", "versions_here"]
