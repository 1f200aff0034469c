"""Analysis step 0: step time and throughput (the :class:`StepAnalysis` the other steps fill).

Step time is each analyzed step's wall time (ns); tokens/s and samples/s divide the tokens and
samples of the analyzed steps by their summed wall time.
"""

from __future__ import annotations

from meshprof.analyze.steps.options import StepOptions
from meshprof.analyze.steps.timeline import StepTimeline
from meshprof.analyze.steps.types import Distribution, StepAnalysis


def step_times(t: StepTimeline, o: StepOptions) -> StepAnalysis:
    """The analysis with step time and throughput filled, everything else at its default."""
    st = t.steps
    total_time_s = int(st.duration_ns.sum()) / 1e9
    tokens = int(st.tokens.sum())
    samples = int(st.samples.sum())
    return StepAnalysis(
        rank=o.rank,
        steps=t.count,
        warmup_steps=t.warmup_steps,
        step_time=Distribution.of(st.duration_ns),
        tokens_per_s=tokens / total_time_s if total_time_s > 0 else 0.0,
        samples_per_s=samples / total_time_s if total_time_s > 0 else 0.0,
    )
