"""The 3D-parallel layout (dp × tp × pp) and which dimension a process group belongs to.

The one layout type (:class:`Layout`) and the one :func:`dimension_of` of meshprof: collection
(the step monitor), the run directory (rank meta, manifest), the analyzers and the demo all use
these. No torch import: any layer may import this module.

With a dp × tp × pp layout, global rank = dp_rank·tp·pp + tp_rank·pp + pp_rank (PP varies
fastest, then TP, then DP). A group whose members differ only in one coordinate belongs to that
dimension. Without a layout, the group's description ("mesh_dp", "tp", ...) decides; anything
else is "other".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from meshprof.errors import MeshprofError
from meshprof.records.members import Members

DIMS = ("dp", "tp", "pp")
_PAIR_RE = re.compile(r"^\s*[A-Za-z_]\w*\s*=\s*\d+\s*$")


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

    def to_dict(self) -> dict[str, int]:
        """``{"dp": .., "tp": .., "pp": ..}``, as the run directory stores a layout."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp}

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


def parse_layout(text: str, what: str = "layout") -> dict[str, int]:
    """``"dp=2,tp=1,pp=2"`` -> ``{"dp": 2, "tp": 1, "pp": 2}`` (names kept as given); anything
    else raises :class:`MeshprofError` naming ``what`` (e.g. ``"MESHPROF_LAYOUT='x'"``)."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts or not all(_PAIR_RE.match(p) for p in parts):
        raise MeshprofError(f"{what}: expected name=size pairs such as dp=2,tp=1,pp=2")
    out: dict[str, int] = {}
    for p in parts:
        k, v = p.split("=")
        out[k.strip()] = int(v)
    return out


def _from_desc(desc: str) -> str:
    d = desc.lower()
    for dim in DIMS:
        if (
            d == dim
            or d.endswith(f"_{dim}")
            or d.startswith(f"{dim}_")
            or f"_{dim}_" in d
            or f"mesh_{dim}" in d
        ):
            return dim
    return "other"


def dimension_of(group_ranks: Iterable[int], layout: object, desc: str = "") -> str:
    """The parallel dimension a process group spans, from its members' global ranks.

    With a layout (a :class:`Layout`, a ParallelConfig or RankMapping, a ``{"dp", "tp", "pp"}``
    dict or a ``"dp=2,tp=2,pp=1"`` string) whose world holds every member:

    - "dp", "tp" or "pp" when the members differ in that coordinate only (a whole group of that
      dimension, or a subset of one);
    - "world" when they are the whole world and more than one dimension is > 1 (when only one is,
      the world group is that dimension's group and gets its name);
    - a "+"-joined mix in dp, tp, pp order ("dp+tp") for other groups spanning several
      dimensions (flattened meshes such as FSDP's dp_shard × cp).

    Otherwise (no layout, a single-rank group, ranks outside the layout) the group's description
    decides ("mesh_tp", "tp", "dp_shard" -> that dimension), and anything else is "other".
    This is the one definition every part of meshprof uses (the step monitor, the cross-rank
    report's event table, the demo's summary, the layout planner).
    """
    try:
        lay = Layout.from_any(layout)
    except (TypeError, ValueError):
        lay = None
    if lay is not None and min(lay.dp, lay.tp, lay.pp) < 1:
        lay = None
    # every rank file lists the same groups: one answer per distinct group (the per-rank step
    # analyses of a 4,096-rank run otherwise redo the world group's 4,096 members per rank)
    # (a group read from a run is Members: hashed and compared in O(1) when a range, where a
    # tuple of the world group's 100,000 members per rank made the step analyses O(N²))
    members = group_ranks if isinstance(group_ranks, Members) else tuple(group_ranks)
    try:
        return _dimension_cached(members, lay, desc)
    except TypeError:  # unhashable members
        return _dimension(members, lay, desc)


def group_label(name: str, group_ranks: Iterable[int], layout: object, desc: str = "") -> str:
    """How tables name a process group: its dimension (:func:`dimension_of`) and its
    description, e.g. "pp mesh_pp", "world default_pg"; the group's own name stands in for a
    missing description ("dp #3"). Names such as "7" mean nothing to a reader."""
    dim = dimension_of(group_ranks, layout, desc)
    if desc and desc != "undefined" and desc != dim:
        return f"{dim} {desc}"
    return f"{dim} #{name}"


@functools.lru_cache(maxsize=4096)
def _dimension_cached(group_ranks: Sequence[int], lay: Layout | None, desc: str) -> str:
    return _dimension(group_ranks, lay, desc)


def _dimension(group_ranks: Sequence[int], lay: Layout | None, desc: str) -> str:
    ranks = sorted({int(r) for r in group_ranks})
    if lay is not None and len(ranks) > 1 and ranks[0] >= 0 and ranks[-1] < lay.world_size:
        coords = [lay.coords(r) for r in ranks]
        varying = [DIMS[i] for i in range(3) if len({c[i] for c in coords}) > 1]
        if len(varying) == 1:
            return varying[0]
        if len(ranks) == lay.world_size:
            return "world"
        return "+".join(varying)
    return _from_desc(desc)
