"""The event table: every rank's collectives in one table, matched across ranks, on one clock, windowed, and the changes of regime along the run."""
