"""Ground truth for meshprof's conclusions: a discrete-event simulator of 3D-parallel training
jobs (:mod:`sim.jobsim`) and a writer of its timelines as run directories
(:mod:`sim.write_rundir`). Neither imports meshprof's analysis or report: the simulator is
numpy only, the writer uses :mod:`meshprof.rundir` and :mod:`meshprof.events` to write files."""
