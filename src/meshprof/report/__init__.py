"""The cross-rank run report: its stages (:mod:`.stages`), the executor that runs them
(:mod:`.executor`) and the typed report (:mod:`.run_report`).

``analyze_run(run)`` is the whole report of a loaded run; ``run_stages(run, REPORT_STAGES,
only=[...])`` computes just what some sections need (``meshprof export`` takes the event table,
clock alignment and match that way)."""
