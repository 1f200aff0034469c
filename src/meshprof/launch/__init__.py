"""``meshprof run``: the torchrun wrapper, the worker bootstrap, the launcher's record of the job, and the local spawner."""
