"""The cross-rank analyses of a run directory: event table, clock alignment, collective matching, stragglers, what-if replay, failures, findings and the report's tables."""
