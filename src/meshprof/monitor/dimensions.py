"""Which parallel dimension (dp, tp, pp) a process group belongs to.

With a dp × tp × pp layout, global rank = dp_rank·tp·pp + tp_rank·pp + pp_rank (PP varies
fastest, then TP, then DP). A group whose members differ only in one coordinate belongs to that
dimension. Without a layout, the group's description ("mesh_dp", "tp", ...) decides; anything
else is "other".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DIMS = ("dp", "tp", "pp")


@dataclass(frozen=True, slots=True)
class Layout:
    """Sizes of the three parallel dimensions."""

    dp: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp_rank, tp_rank, pp_rank) of a global rank."""
        return rank // (self.tp * self.pp), (rank // self.pp) % self.tp, rank % self.pp

    @classmethod
    def from_any(cls, obj: object) -> Layout | None:
        """A Layout from a ParallelConfig, a RankMapping, a dict or a "dp=2,tp=1,pp=2" string."""
        if obj is None:
            return None
        if isinstance(obj, Layout):
            return obj
        if isinstance(obj, str):
            parts = dict(p.split("=", 1) for p in obj.replace(" ", "").split(",") if "=" in p)
            return cls(int(parts.get("dp", 1)), int(parts.get("tp", 1)), int(parts.get("pp", 1)))
        if isinstance(obj, dict):
            return cls(int(obj.get("dp", 1)), int(obj.get("tp", 1)), int(obj.get("pp", 1)))
        cfg = getattr(obj, "config", obj)
        try:
            return cls(
                int(getattr(cfg, "dp", 1)), int(getattr(cfg, "tp", 1)), int(getattr(cfg, "pp", 1))
            )
        except (TypeError, ValueError):
            return None


def dimension_of(group_ranks: Sequence[int], layout: Layout | None, desc: str = "") -> str:
    """ "dp", "tp", "pp", "world" or "other" for a group with these global ranks."""
    ranks = list(group_ranks)
    if layout is not None and len(ranks) > 1 and max(ranks) < layout.world_size:
        coords = [layout.coords(r) for r in ranks]
        varying = [i for i in range(3) if len({c[i] for c in coords}) > 1]
        if len(varying) == 1:
            return DIMS[varying[0]]
        if len(ranks) == layout.world_size:
            return "world"
        return "other"
    d = desc.lower()
    for dim in DIMS:
        if d == dim or d.endswith(f"_{dim}") or d.startswith(f"{dim}_") or f"mesh_{dim}" in d:
            return dim
    return "other"
