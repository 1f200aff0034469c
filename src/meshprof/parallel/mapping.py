"""Global rank ↔ (dp_rank, tp_rank, pp_rank), the process groups of each dimension, and which
dimension a recorded collective belongs to.

Order: PP varies fastest, then TP, then DP::

    rank = dp_rank · (tp · pp) + tp_rank · pp + pp_rank

so a DeviceMesh of shape (dp, tp, pp) with names ("dp", "tp", "pp") over ``range(world_size)``
has exactly these coordinates (``meshprof.parallel.mesh.build_mesh`` builds it so, and a test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshprof.errors import MeshprofError
from meshprof.parallel.parallel_config import ParallelConfig

Dimension = str
"""A dimension label: "dp", "tp", "pp", "world", a "+"-joined mix ("tp+pp") or "other"."""


@dataclass(frozen=True, slots=True)
class RankCoords:
    """A rank's position in the 3D layout."""

    dp_rank: int
    """Index of the rank's data-parallel replica (0 … dp − 1)."""
    tp_rank: int
    """Index of the rank within its tensor-parallel group (0 … tp − 1)."""
    pp_rank: int
    """Pipeline position (0 … pp − 1); 0 holds the embedding, pp − 1 the output layer."""

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.dp_rank, self.tp_rank, self.pp_rank)


def coords_of(config: ParallelConfig, rank: int) -> RankCoords:
    """(dp_rank, tp_rank, pp_rank) of a global rank."""
    if not 0 <= rank < config.world_size:
        raise MeshprofError(
            f"rank {rank} is outside the layout dp×tp×pp = {config.world_size} ranks"
        )
    pp_rank = rank % config.pp
    tp_rank = (rank // config.pp) % config.tp
    dp_rank = rank // (config.pp * config.tp)
    return RankCoords(dp_rank, tp_rank, pp_rank)


def rank_of(config: ParallelConfig, dp_rank: int, tp_rank: int, pp_rank: int) -> int:
    """The global rank at (dp_rank, tp_rank, pp_rank): the inverse of :func:`coords_of`."""
    for name, value, size in (
        ("dp_rank", dp_rank, config.dp),
        ("tp_rank", tp_rank, config.tp),
        ("pp_rank", pp_rank, config.pp),
    ):
        if not 0 <= value < size:
            raise MeshprofError(f"{name}={value} is outside 0…{size - 1}")
    return dp_rank * config.tp * config.pp + tp_rank * config.pp + pp_rank


@dataclass(frozen=True, slots=True)
class RankMapping:
    """Where one rank sits in a :class:`ParallelConfig` layout and who its peers are.

    ``RankMapping(config, rank)``; groups are tuples of global ranks in increasing order.
    """

    config: ParallelConfig
    """The layout."""
    rank: int
    """The global rank this mapping describes."""

    def __post_init__(self) -> None:
        coords_of(self.config, self.rank)  # range check

    @property
    def coords(self) -> RankCoords:
        """(dp_rank, tp_rank, pp_rank) of this rank."""
        return coords_of(self.config, self.rank)

    @property
    def dp_rank(self) -> int:
        return self.coords.dp_rank

    @property
    def tp_rank(self) -> int:
        return self.coords.tp_rank

    @property
    def pp_rank(self) -> int:
        return self.coords.pp_rank

    def rank_at(self, dp_rank: int, tp_rank: int, pp_rank: int) -> int:
        """Global rank at the given coordinates (the inverse mapping)."""
        return rank_of(self.config, dp_rank, tp_rank, pp_rank)

    @property
    def dp_group(self) -> tuple[int, ...]:
        """Ranks with this rank's tp_rank and pp_rank: they hold the same parameters' shards."""
        c = self.coords
        return tuple(rank_of(self.config, d, c.tp_rank, c.pp_rank) for d in range(self.config.dp))

    @property
    def tp_group(self) -> tuple[int, ...]:
        """Ranks with this rank's dp_rank and pp_rank: they split the same matrices."""
        c = self.coords
        return tuple(rank_of(self.config, c.dp_rank, t, c.pp_rank) for t in range(self.config.tp))

    @property
    def pp_group(self) -> tuple[int, ...]:
        """Ranks with this rank's dp_rank and tp_rank, in pipeline order."""
        c = self.coords
        return tuple(rank_of(self.config, c.dp_rank, c.tp_rank, p) for p in range(self.config.pp))

    @property
    def next_pp_rank(self) -> int | None:
        """Global rank of the next pipeline stage (activations go there); None on the last."""
        c = self.coords
        return (
            None
            if c.pp_rank == self.config.pp - 1
            else rank_of(self.config, c.dp_rank, c.tp_rank, c.pp_rank + 1)
        )

    @property
    def prev_pp_rank(self) -> int | None:
        """Global rank of the previous pipeline stage (activations come from there); None on the first."""
        c = self.coords
        return None if c.pp_rank == 0 else rank_of(self.config, c.dp_rank, c.tp_rank, c.pp_rank - 1)

    def stage_indices(self) -> tuple[int, ...]:
        """Pipeline stage (chunk) indices this rank runs, in increasing order.

        Looped schedules put stage s on pp_rank s mod pp; V schedules put stages r and
        2·pp − 1 − r on pp_rank r.
        """
        cfg, r = self.config, self.pp_rank
        if cfg.pp > 1 and cfg.schedule.is_v_shape:
            return (r, 2 * cfg.pp - 1 - r)
        return tuple(r + k * cfg.pp for k in range(cfg.virtual_stages if cfg.pp > 1 else 1))

    def layers(self) -> tuple[int, ...]:
        """Indices of the transformer blocks this rank holds."""
        per = self.config.num_layers // (self.config.num_stages if self.config.pp > 1 else 1)
        return tuple(i for s in self.stage_indices() for i in range(s * per, (s + 1) * per))

    def groups(self) -> dict[str, tuple[int, ...]]:
        """{"dp": dp_group, "tp": tp_group, "pp": pp_group}."""
        return {"dp": self.dp_group, "tp": self.tp_group, "pp": self.pp_group}


def all_groups(config: ParallelConfig, dim: str) -> list[tuple[int, ...]]:
    """Every distinct group of dimension ``dim`` ("dp", "tp" or "pp"), sorted."""
    seen = {getattr(RankMapping(config, r), f"{dim}_group") for r in range(config.world_size)}
    return sorted(seen)


__all__ = [
    "Dimension",
    "RankCoords",
    "RankMapping",
    "all_groups",
    "coords_of",
    "rank_of",
]
