"""The job's own DeviceMesh dimension names, per process group: what the job calls each group.

A DeviceMesh names its dimensions (``("dp", "tp")``, torchtitan's ``("pp", "batch", "cp",
"tp")``, transformers' ``("pp", "dp_replicate", "fsdp", "tp")``) and holds one process group
per dimension on each rank. A dimension that spans every rank reuses the world group
(``default_pg``), whose description then says nothing of the dimension: the names are the only
record of it. :class:`MeshNames` learns them as the job builds its meshes and the recorder writes
them into the rank file's group records (``GroupRecord.mesh_dims``).

How: ``DeviceMesh.__init__`` is wrapped (one of the recorder's reversible patches). After the
original returns, the mesh's dimension names and groups are read with DeviceMesh's public API
(``mesh_dim_names``, ``get_group(i).group_name``). Meshes whose groups are attached after their
``__init__`` (slices, ``_unflatten`` as torchtitan uses it, ``from_group``) are kept by weak
reference and read at the next :meth:`MeshNames.names` (the rank writer's next write): a mesh
the job dropped by then is not kept alive for it. Meshes built before the recorder was installed
are not seen (``meshprof run`` installs it before the script runs).

Never harms the job: the wrapper calls the original first and returns what it returns; anything
that fails here is caught and reported to the recorder, never raised. Bounded: at most
:data:`MAX_GROUPS` groups, :data:`MAX_NAMES` names each, :data:`MAX_PENDING` meshes waiting.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

from meshprof.comm.patching import Patches

MAX_GROUPS = 4096
"""Groups whose names are kept (a job builds a few meshes; a new group past this is left out)."""
MAX_NAMES = 16
"""Names kept per group (several meshes may reuse one group)."""
MAX_PENDING = 1024
"""Meshes kept (weakly) until their groups can be read; the oldest is let go past this."""


class MeshNames:
    """Group name -> the DeviceMesh dimension names the job gave it, in the order first seen."""

    def __init__(self) -> None:
        self._names: dict[str, list[str]] = {}
        self._pending: list[weakref.ref[Any]] = []
        self._lock = threading.Lock()
        self.version = 0
        """Grows each time a name is learnt (a reader's cache of dimensions is stale when it
        changed)."""
        self.on_error: Callable[[BaseException], None] | None = None
        """Told of an error inside meshprof (the recorder counts and reports it)."""

    # -- installation -------------------------------------------------------------------------
    def install(self, patches: Patches) -> None:
        """Wrap ``DeviceMesh.__init__`` (undone with ``patches``); a torch without DeviceMesh
        is left alone."""
        try:
            from torch.distributed.device_mesh import DeviceMesh
        except Exception:
            return
        original = DeviceMesh.__dict__.get("__init__")
        if original is None or getattr(original, "_meshprof_mesh_names", False):
            return
        patches.replace(DeviceMesh, "__init__", self._wrap(original), original)

    def _wrap(self, original: Callable[..., None]) -> Callable[..., None]:
        names = self

        @functools.wraps(original)
        def __init__(mesh: Any, *args: Any, **kwargs: Any) -> None:
            original(mesh, *args, **kwargs)
            try:
                names.note(mesh)
            except Exception as e:  # (never into the job)
                names._error(e)

        __init__._meshprof_mesh_names = True  # type: ignore[attr-defined]
        return __init__

    # -- learning -----------------------------------------------------------------------------
    def note(self, mesh: Any) -> None:
        """Learn ``mesh``'s names now, or keep it (weakly) until its groups are attached."""
        if self._read(mesh):
            return
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self._pending = [r for r in self._pending if r() is not None]
                if len(self._pending) >= MAX_PENDING:
                    del self._pending[0]
            self._pending.append(weakref.ref(mesh))

    def _read(self, mesh: Any) -> bool:
        """Add ``mesh``'s (dimension name, group name) pairs; False while its groups are not
        attached yet (a slice or an unflattened mesh inside its own construction)."""
        dim_names = getattr(mesh, "mesh_dim_names", None)
        if not dim_names:
            return True  # an unnamed mesh: nothing to learn, now or later
        if not hasattr(mesh, "_dim_group_names"):  # (get_group would raise RuntimeError)
            return False
        pairs: list[tuple[str, str]] = []
        for i, dim in enumerate(dim_names):
            try:
                group = mesh.get_group(i)
            except Exception:
                continue  # this rank is not in the mesh, or the dimension has no group here
            pairs.append((str(dim), str(group.group_name)))
        with self._lock:
            for dim, group_name in pairs:
                have = self._names.get(group_name)
                if have is None:
                    if len(self._names) >= MAX_GROUPS:
                        continue
                    have = self._names[group_name] = []
                if dim not in have and len(have) < MAX_NAMES:
                    have.append(dim)
                    self.version += 1
        return True

    def _error(self, e: BaseException) -> None:
        if self.on_error is not None:
            with contextlib.suppress(Exception):
                self.on_error(e)

    # -- reading ------------------------------------------------------------------------------
    def names(self) -> dict[str, list[str]]:
        """Group name -> its dimension names, after reading the meshes still waiting."""
        try:
            with self._lock:
                pending, self._pending = self._pending, []
            waiting = []
            for ref in pending:
                mesh = ref()
                if mesh is not None and not self._read(mesh):
                    waiting.append(ref)
            if waiting:
                with self._lock:
                    self._pending[:0] = waiting
                    del self._pending[: max(0, len(self._pending) - MAX_PENDING)]
        except Exception as e:
            self._error(e)
        with self._lock:
            return {k: list(v) for k, v in self._names.items()}

    def of(self, group_name: str) -> tuple[str, ...]:
        """The names learnt so far for one group (meshes still waiting are not read here)."""
        with self._lock:
            return tuple(self._names.get(group_name, ()))


__all__ = ["MAX_GROUPS", "MAX_NAMES", "MAX_PENDING", "MeshNames"]
