"""Pure functions over live snapshots: the alert rules and ``meshprof top``'s table."""
