"""The torch.profiler traces in the run directory (written by ``@performance_monitor``, or put
there by the user): HTA's GPU breakdown per rank (the host split on CPU-only traces), the files
not read, the kernel-level straggler (:mod:`meshprof.analyze.traces.kineto`)."""

from __future__ import annotations

from meshprof.analyze.traces.kineto import KinetoReport, find_traces, kineto_report
from meshprof.report.stage import Key, ReportOptions, stage
from meshprof.rundir import LoadedRun

KINETO: Key[KinetoReport] = Key("kineto")


@stage(KINETO)
def kineto(run: LoadedRun, options: ReportOptions) -> KinetoReport:
    """The traces' report; :attr:`KinetoReport.found` is False when there are none."""
    try:
        paths = find_traces(run.path)
        if not paths:
            return KinetoReport((), found=False)
        return kineto_report(paths, hta_rounding=options.hta_rounding)
    except Exception as e:  # a damaged trace must not cost the rest of the report
        return KinetoReport((), problems=(f"{type(e).__name__}: {e}",))


STAGES = (kineto,)
