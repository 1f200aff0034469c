"""Weights & Biases logging for the performance monitor (optional extra: ``pip install meshprof[wandb]``).

Works offline with no network: set ``WANDB_MODE=offline`` (the run is then written under
``<dir>/wandb/offline-run-*`` and can be uploaded later with ``wandb sync``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from meshprof.errors import MeshprofError

MISSING = "W&B logging needs the wandb package: pip install 'meshprof[wandb]'"


class WandbLogger:
    """One W&B run; ``log`` sends a dict of numbers at a step (a
    :class:`~meshprof.perfmon.loggers.MetricLogger`)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        config: Mapping[str, Any] | None = None,
        project: str | None = None,
        name: str | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError:
            raise MeshprofError(MISSING) from None
        self._wandb: Any = wandb
        os.makedirs(directory, exist_ok=True)
        self.run: Any = wandb.init(
            project=project or os.environ.get("WANDB_PROJECT", "meshprof"),
            name=name,
            dir=str(directory),
            config=dict(config or {}),
            reinit="finish_previous",
        )
        self.run_dir = str(getattr(self.run, "dir", directory))
        """The run's files folder (``.../wandb/<run>/files``)."""

    def log(self, values: Mapping[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in values.items() if v is not None and v == v}
        if clean:
            self.run.log(clean, step=step)

    def close(self) -> None:
        self.run.finish()
