"""The 3D-parallel layout (dp × tp × pp) and which dimension a process group belongs to.

The one layout type (:class:`Layout`) and the one :func:`dimension_of` of meshprof: collection
(the step monitor), the run directory (rank meta, manifest), the analyzers and the demo all use
these. No torch import: any layer may import this module.

With a dp × tp × pp layout, global rank = dp_rank·tp·pp + tp_rank·pp + pp_rank (PP varies
fastest, then TP, then DP). A group whose members differ only in one coordinate belongs to that
dimension. The job's own DeviceMesh dimension names (``tp``, ``dp_shard``, torchtitan's
``dp_shard_cp``, ...: :func:`dimension_of_names`) name a group the user's layout does not
place; without either, the group's description ("mesh_dp", "tp", ...) decides; anything else is
"other". :func:`dimension_of` says which source wins.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from meshprof.errors import MeshprofError
from meshprof.records.members import Members

DIMS = ("dp", "tp", "pp")
MESH_DIMS = ("dp", "tp", "pp", "cp", "ep")
"""The dimensions a DeviceMesh name can say, in the order a "+"-joined mix lists them (context
and expert parallelism have no coordinate in a :class:`Layout`)."""
MESH_DIM_PRIORITY = ("tp", "cp", "ep", "pp", "dp")
"""Which dimension a group named for several gets (:func:`dimension_of_names`): the first of
these. Frameworks build several meshes over the same ranks, and the one that spans the world
reuses the world group: transformers' TP mesh names it ``tp`` and its expert mesh ``efsdp``,
torchtitan's ``world``, ``tp`` and ``efsdp``. A data-parallel name on such a group comes from a
mesh derived for sharding or the loss (``efsdp``, ``batch``), built whatever the job runs,
while ``tp``, ``cp``, ``ep`` and ``pp`` are named only for a degree the job asked for."""
MESH_NAMES: dict[str, str] = {
    "dp": "dp",
    "ddp": "dp",
    "fsdp": "dp",
    "hsdp": "dp",
    "efsdp": "dp",
    "dp_replicate": "dp",
    "dp_shard": "dp",
    "dp_shard_mod_ep": "dp",
    "dp_shard_in_ep": "dp",
    "replicate": "dp",
    "shard": "dp",
    "data": "dp",
    "data_parallel": "dp",
    "batch": "dp",
    "tp": "tp",
    "tensor": "tp",
    "tensor_parallel": "tp",
    "pp": "pp",
    "pipeline": "pp",
    "pipeline_parallel": "pp",
    "cp": "cp",
    "context": "cp",
    "context_parallel": "cp",
    "ep": "ep",
    "expert": "ep",
    "expert_parallel": "ep",
}
"""DeviceMesh dimension names (lower case) and the dimension each says: PyTorch's examples and
docs (``dp``, ``tp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``pp``, ``ep``), torchtitan's
(``batch``, ``fsdp``, ``efsdp``, ``dp_shard_mod_ep``, ``dp_shard_in_ep``) and Hugging Face
transformers' (``pp``, ``dp_replicate``, ``fsdp``, ``tp``, ``efsdp``, ``ep``). A flattened
dimension's name joins its parts with "_" (``dp_shard_cp``, ``dp_cp``): each part is looked up
(the longest known run of parts first). ``world`` (torchtitan's mesh of all ranks), unnamed
dimensions (``dim_0``) and any name with an unknown part (torchtitan's ``loss_mesh``) say
nothing."""
MAX_NAME_PARTS = 8
"""A DeviceMesh name of more "_"-separated parts than this says nothing (flattened names of
real meshes have two to four)."""
MAX_NAMES_READ = 16
"""Names of one group looked at (the recorder keeps at most as many)."""
_PAIR_RE = re.compile(r"^\s*[A-Za-z_]\w*\s*=\s*\d+\s*$")


@dataclass(frozen=True, slots=True)
class Layout:
    """Sizes of the three parallel dimensions."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    assumed: bool = field(default=False, compare=False)
    """Nobody gave it: ``meshprof run`` without ``--layout`` assumed pure data parallelism over
    the world. A group the job's DeviceMesh names is named by its mesh, not by this guess
    (:func:`dimension_of`). Not part of equality."""

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


def _name_dims(name: str) -> str | None:
    """The dimension one DeviceMesh dimension name says (:data:`MESH_NAMES`): a dimension, a
    "+"-joined mix in :data:`MESH_DIMS` order for a flattened name, or None."""
    key = name.strip().lower()
    if key in MESH_NAMES:
        return MESH_NAMES[key]
    parts = [p for p in key.split("_", MAX_NAME_PARTS) if p]
    if len(parts) > MAX_NAME_PARTS:
        return None  # (a name read from a file: bounded work whatever it holds)
    found: set[str] = set()
    i = 0
    while i < len(parts):
        for j in range(len(parts), i, -1):  # the longest known run of parts first
            dim = MESH_NAMES.get("_".join(parts[i:j]))
            if dim is not None:
                found.add(dim)
                i = j
                break
        else:
            return None  # an unknown part: the name says nothing
    if not found:
        return None
    return "+".join(d for d in MESH_DIMS if d in found)


def dimension_of_names(names: Iterable[str]) -> str | None:
    """The dimension the DeviceMesh dimension names given to one process group say, or None
    when none says one (:data:`MESH_NAMES`). A group named for several dimensions (one group
    reused by several meshes) gets the first in :data:`MESH_DIM_PRIORITY` order; a flattened
    name only when no plain one ranks before it."""
    best: tuple[int, int, str] | None = None
    for name in itertools.islice(names, MAX_NAMES_READ):
        dim = _name_dims(str(name))
        if dim is None:
            continue
        parts = dim.split("+")
        key = (min(MESH_DIM_PRIORITY.index(d) for d in parts), len(parts), dim)
        if best is None or key < best:
            best = key
    return best[2] if best is not None else None


def names_refute_pure_dp(groups: Iterable[tuple[int, Iterable[str]]]) -> bool:
    """True when the DeviceMesh names of a rank's groups (``(size, names)`` per group) say the
    job is not purely data parallel: a group of several ranks named for another dimension
    (then an assumed pure-DP layout is dropped, see :func:`meshprof.rundir.resolve_layout`)."""
    for size, names in groups:
        if size > 1:
            dim = dimension_of_names(names)
            if dim is not None and dim != "dp":
                return True
    return False


def dimension_of(
    group_ranks: Iterable[int], layout: object, desc: str = "", mesh_dims: Iterable[str] = ()
) -> str:
    """The parallel dimension a process group spans, from its members' global ranks, the job's
    DeviceMesh dimension names for it (``mesh_dims``) and its description. The first that
    tells decides:

    1. a layout the user gave (``--layout``, ``$MESHPROF_LAYOUT``, a StepMonitor's mapping)
       whose world holds every member of a group of several ranks: their coordinates (the
       user's word is final, even against the job's mesh names);
    2. the job's own DeviceMesh names of the group (:func:`dimension_of_names`): "tp" for the
       world group that transformers' TP mesh reuses;
    3. a layout that was only assumed (:attr:`Layout.assumed`): the coordinates, as in 1;
    4. the group's description.

    With a layout (a :class:`Layout`, a ParallelConfig or RankMapping, a ``{"dp", "tp", "pp"}``
    dict or a ``"dp=2,tp=2,pp=1"`` string) whose world holds every member:

    - "dp", "tp" or "pp" when the members differ in that coordinate only (a whole group of that
      dimension, or a subset of one);
    - "world" when they are the whole world and more than one dimension is > 1 (when only one is,
      the world group is that dimension's group and gets its name);
    - a "+"-joined mix in dp, tp, pp order ("dp+tp") for other groups spanning several
      dimensions (flattened meshes such as FSDP's dp_shard × cp).

    Otherwise (no layout, a single-rank group, ranks outside the layout) the mesh names, then
    the group's description decide ("mesh_tp", "tp", "dp_shard" -> that dimension), and
    anything else is "other". The mesh names may also say "cp", "ep" or a mix ("dp+cp").
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
    named = dimension_of_names(mesh_dims) if mesh_dims else None
    if named is not None:
        if lay is None or lay.assumed:
            return named
        lay_only = _coordinates_dim(members, lay)  # the user's layout, where it places them
        return lay_only if lay_only is not None else named
    try:
        return _dimension_cached(members, lay, desc)
    except TypeError:  # unhashable members
        return _dimension(members, lay, desc)


def group_label(
    name: str,
    group_ranks: Iterable[int],
    layout: object,
    desc: str = "",
    mesh_dims: Iterable[str] = (),
) -> str:
    """How tables name a process group: its dimension (:func:`dimension_of`) and its
    description, e.g. "pp mesh_pp", "world default_pg"; the group's own name stands in for a
    missing description ("dp #3"). Names such as "7" mean nothing to a reader."""
    dim = dimension_of(group_ranks, layout, desc, mesh_dims)
    if desc and desc != "undefined" and desc != dim:
        return f"{dim} {desc}"
    return f"{dim} #{name}"


@functools.lru_cache(maxsize=4096)
def _dimension_cached(group_ranks: Sequence[int], lay: Layout | None, desc: str) -> str:
    return _dimension(group_ranks, lay, desc)


def _dimension(group_ranks: Sequence[int], lay: Layout | None, desc: str) -> str:
    dim = _coordinates_dim(group_ranks, lay)
    return dim if dim is not None else _from_desc(desc)


def _coordinates_dim(group_ranks: Sequence[int], lay: Layout | None) -> str | None:
    """The dimension the layout's coordinates give a group of several ranks inside its world
    (None: the layout does not place it)."""
    if lay is None:
        return None
    ranks = sorted({int(r) for r in group_ranks})
    if len(ranks) > 1 and ranks[0] >= 0 and ranks[-1] < lay.world_size:
        coords = [lay.coords(r) for r in ranks]
        varying = [DIMS[i] for i in range(3) if len({c[i] for c in coords}) > 1]
        if len(varying) == 1:
            return varying[0]
        if len(ranks) == lay.world_size:
            return "world"
        return "+".join(varying)
    return None
