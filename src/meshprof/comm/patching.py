"""Reversible replacement of attributes of modules and classes (the recorder's Python patches)."""

from __future__ import annotations

from typing import Any


class Patches:
    """Attributes replaced so far, undone in reverse order by :meth:`undo`."""

    def __init__(self) -> None:
        self._originals: list[tuple[Any, str, Any]] = []

    def replace(self, owner: Any, name: str, new: Any, original: Any) -> None:
        """Set ``owner.name = new``, remembering ``original`` (the value it had) for undo."""
        self._originals.append((owner, name, original))
        setattr(owner, name, new)

    def undo(self) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()
