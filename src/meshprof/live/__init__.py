"""Live monitoring of a running job: per-rank live state (:mod:`.state`, :mod:`.publish`) and
the views that read it."""

from meshprof.live.state import (
    Alert,
    LiveSnapshot,
    RankLive,
    read_snapshot,
    snapshot_to_dict,
)

__all__ = ["Alert", "LiveSnapshot", "RankLive", "read_snapshot", "snapshot_to_dict"]
