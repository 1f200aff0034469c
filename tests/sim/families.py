"""The families of jobs and recordings real programs and recorders produce (issue 41), for the
what-if's property test (``tests/test_what_if_recording.py``) and its benchmark
(``benchmarks/what_if_recording.py``).

A :class:`Family` is one job with one slow rank; its truth is the job re-simulated without
that rank's slowness (:func:`sim.jobsim.true_saving`). Every :data:`RECORDINGS` entry records the
same timeline differently (:mod:`sim.recording`): the what-if's saving of the slow rank must match
the truth under each, and so not change with the recording.

Families:

- program order around point-to-point ops: compute→recv→send (the naive schedule: the issue's
  job), recv→compute→send (GPipe), send before recv (1F1B), batched isend/irecv, an async TP
  all_reduce left in flight across the exchange;
- point-to-point semantics: eager (GPipe's receivers are always early: no send completes before
  its receive is issued, so no eager votes at all), rendezvous, async, mixes (one direction
  eager, the other rendezvous or async);
- the slow rank's stage in a deep pipeline (pp 8): first, middle, last;
- FSDP: the all_gather prefetch of the first microbatch left in flight from the previous
  layer, so that the peers' wait for a slow rank is hidden in their compute.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim.jobsim import US, Job
from sim.recording import Recording


@dataclass(frozen=True, slots=True)
class Family:
    """One job of a family (its slow rank ``slow``)."""

    name: str
    job: Job
    slow: int
    """The slow rank (the what-if's saving of this rank is checked)."""
    default: bool = True
    """In the default (CI) run; the others run with ``MESHPROF_PROPERTY_FULL=1``."""


RECORDINGS: tuple[Recording, ...] = (
    Recording(),
    Recording(lag_ns=50 * US, late_share=0.1, late_ns=400 * US),
    Recording(blocking_lag_ns=20 * US),
    Recording(tied="next"),
    Recording(tied="exchange"),
    Recording(tied="next", scope="some"),
    Recording(tied="exchange", scope="some"),
    Recording(tied="exchange", blocking_lag_ns=20 * US),
    Recording(flags=False),
    Recording(tied="exchange", flags=False),
    Recording(tied="next", flags=False),
    Recording(tied="next", scope="some", flags=False),
    Recording(blocking_lag_ns=20 * US, flags=False),
)
"""How the recorder saw the completions (the first: exactly)."""
DEFAULT_RECORDINGS = (0, 2, 3, 4, 6, 9, 10)
"""Indices into :data:`RECORDINGS` of the default (CI) run."""
TOLERANCE = {"tied-next": 0.20}
"""Recordings whose artifact costs accuracy, with the relative tolerance they get instead of
10 % (known limit): every blocking completion of every chain seen only when the next one
completes leaves no collective to align the clocks on (they are left out), so the clocks are
the timestamp exchange's (± half its round trip, tens of µs), and the repair's earliest member
of a collective is off by that much."""


def families(seed: int = 0) -> list[Family]:
    """The property test's jobs, seeded (``seed`` varies the noise and the slowness)."""
    rng = np.random.default_rng(seed)
    f = float(rng.uniform(0.2, 0.4))

    def job(**kw: object) -> Job:
        base: dict[str, object] = dict(
            dp=2, tp=2, pp=4, layers=2, microbatches=4, jitter=0.01, comm_jitter_ns=2 * US,
            fwd_ns=300 * US, clock_ms=20.0, steps=6, seed=int(rng.integers(1 << 30)),
        )  # fmt: skip
        base.update(kw)
        return Job(**base)  # type: ignore[arg-type]

    def slowed(j: Job, r: int, phases: tuple[str, ...] = ("forward",)) -> Job:
        return replace(j, slow=((r, f),), slow_phases=phases)

    out = [
        Family("compute→recv→send (naive, 4×4×4: the issue's job)",
               slowed(job(dp=4, tp=4, pp=4, schedule="naive", microbatches=1, layers=8,
                          fwd_ns=400 * US, p2p="eager"), 37), 37, default=False),
        Family("compute→recv→send (naive, eager)",
               slowed(job(schedule="naive", microbatches=1, layers=4, p2p="eager"), 5), 5),
        Family("recv→compute→send (GPipe, eager: no eager votes)",
               slowed(job(schedule="gpipe", p2p="eager"), 5), 5),
        Family("send before recv (1F1B, async p2p)",
               slowed(job(schedule="1f1b", p2p="async"), 5), 5),
        Family("batched isend/irecv (1F1B)",
               slowed(job(schedule="1f1b", p2p="rendezvous", batched=True), 5), 5),
        Family("async TP all_reduce in flight across the exchange (1F1B)",
               slowed(job(schedule="1f1b", p2p="async", tp_inflight=True), 5), 5),
        Family("mixed p2p: eager forward, rendezvous backward (GPipe)",
               slowed(job(schedule="gpipe", p2p="eager", p2p_back="rendezvous"), 6), 6,
               default=False),
        Family("mixed p2p: eager forward, async backward (1F1B)",
               slowed(job(schedule="1f1b", p2p="eager", p2p_back="async"), 6), 6,
               default=False),
        Family("rendezvous p2p (GPipe)",
               slowed(job(schedule="gpipe", p2p="rendezvous"), 6), 6, default=False),
        Family("deep pipeline pp 8, slow first stage (1F1B)",
               slowed(job(pp=8, schedule="1f1b", p2p="async", layers=1), 8), 8,
               default=False),
        Family("deep pipeline pp 8, slow middle stage (1F1B)",
               slowed(job(pp=8, schedule="1f1b", p2p="async", layers=1), 12), 12),
        Family("deep pipeline pp 8, slow last stage (1F1B)",
               slowed(job(pp=8, schedule="1f1b", p2p="async", layers=1), 15), 15,
               default=False),
        Family("FSDP prefetch waits hidden in the peers' compute (dp 4 × pp 2)",
               slowed(job(dp=4, tp=1, pp=2, schedule="gpipe", p2p="eager", dp_mode="fsdp",
                          layers=3), 2), 2),
    ]  # fmt: skip
    return out
