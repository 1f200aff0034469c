"""The what-if's saving of a family's slow rank under every recording, against the simulator's
truth (:mod:`sim.families`; this module runs meshprof's report, :mod:`sim.jobsim` never does).

For one :class:`~sim.families.Family`: simulate the job once, re-simulate it without the slow
rank's slowness (the truth), and for each :class:`~sim.recording.Recording` write the same
timeline as that recorder saw it, run the report and take the slow rank's saving. A saving is
*right* when within 10 % of the truth or 20 µs (:data:`sim.families.TOLERANCE` for a known
limit), or when the report says it cannot measure it (the rank has no peers, or the record cannot tell: ``WhatIf.doubt``) — never a
confident wrong number; it is *invariant* when within that tolerance of the saving from the
exact recording (or either is "not measured")."""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from meshprof.report.analysis import analyze_run
from meshprof.report.stages.what_if import WHAT_IF_REPLAY
from sim.check import ABS_TOL_NS, load_recorded
from sim.families import TOLERANCE, Family
from sim.jobsim import Fix, simulate, true_saving
from sim.recording import Recording
from sim.write_rundir import write_run


@dataclass(frozen=True, slots=True)
class RecordingResult:
    """The slow rank's saving under one recording."""

    family: str
    recording: str
    truth_ns: float
    saving_ns: float
    """The what-if's saving of the slow rank (NaN: not replayed, or not measured)."""
    measured: bool
    """The report gives the saving as a measurement (the rank has peers, no doubt)."""
    why_not: str
    """Why not, when not measured."""
    top: bool
    """The slow rank is the what-if's costliest rank."""
    exact_ns: float
    """The saving from the exact recording (NaN when not measured)."""
    seconds: float

    @property
    def tolerance_ns(self) -> float:
        """10 % of the truth or 20 µs (:data:`sim.families.TOLERANCE` for a known limit)."""
        return max(TOLERANCE.get(self.recording, 0.1) * abs(self.truth_ns), ABS_TOL_NS)

    @property
    def right(self) -> bool:
        """Within the tolerance of the truth, or said not measured; when measured, the slow
        rank is the costliest one."""
        return not self.measured or (
            abs(self.saving_ns - self.truth_ns) <= self.tolerance_ns and self.top
        )

    @property
    def invariant(self) -> bool:
        """The same saving as from the exact recording (within the tolerance of the truth),
        or not measured under one of them."""
        if not self.measured or math.isnan(self.exact_ns):
            return True
        return abs(self.saving_ns - self.exact_ns) <= self.tolerance_ns


def check_family(
    fam: Family, recordings: tuple[Recording, ...], work: Path | None = None
) -> list[RecordingResult]:
    """Every recording of ``fam``'s job (run directories under ``work``, a temporary one by
    default, removed afterwards); the first recording should be the exact one."""
    tmp = Path(tempfile.mkdtemp(prefix="recording-", dir=work))
    try:
        tl = simulate(fam.job)
        truth = true_saving(fam.job, Fix(ranks=frozenset({fam.slow})), tl)
        out: list[RecordingResult] = []
        exact = float("nan")
        for i, rec in enumerate(recordings):
            t0 = time.perf_counter()
            d = write_run(tmp / str(i), tl, recording=rec)
            w = analyze_run(load_recorded(d, rec.flags))[WHAT_IF_REPLAY]
            mine = next((c for c in w.ranks if c.rank == fam.slow), None)
            why = w.note or w.doubt
            if mine is not None and not mine.peers:
                why = why or "no peers"
            measured = mine is not None and not why
            got = mine.step_saving_ns if mine is not None else float("nan")
            top = bool(w.ranks) and w.ranks[0].rank == fam.slow
            if i == 0 and rec == Recording() and measured:
                exact = got
            out.append(
                RecordingResult(fam.name, rec.name, truth, got, measured, why, top, exact,
                                time.perf_counter() - t0)
            )  # fmt: skip
            shutil.rmtree(d, ignore_errors=True)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
