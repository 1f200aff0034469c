"""``python -m meshprof.launch.torchrun <torchrun options>``: torchrun, keeping how workers failed.

``meshprof run`` starts this instead of ``python -m torch.distributed.run``: it is torchrun
itself (``torch.distributed.run.main`` in this process: same options, output and exit code).
When workers fail, torchrun raises ``ChildFailedError``; before it propagates as usual, each
failure (global rank, local rank, pid, exit code: negative for a signal) is written to the file
its :class:`~meshprof.records.worker_settings.WorkerSettings` names (:mod:`meshprof.rundir.worker_exits`)
for the launcher.

It also asks the kernel to send it SIGTERM when the launcher dies (``PR_SET_PDEATHSIG``, Linux):
torchrun then ends its workers as it does on any SIGTERM, so a launcher killed by SIGKILL does
not leave the job running unsupervised (the workers also watch the launcher themselves:
:func:`meshprof.launch.bootstrap.watch_launcher`).

Before torchrun starts the workers it does what needs torch, so that the launcher never imports
it: the native recorder is made ready (:mod:`meshprof.launch.native_prep`) and the versions for
the manifest are written (:mod:`meshprof.launch.job_versions`).
"""

from __future__ import annotations

import contextlib
import os
import sys

from meshprof.launch.job_versions import report_versions
from meshprof.launch.native_prep import prepare_in_torchrun
from meshprof.records.worker_settings import WorkerSettings


def save_failures(error: BaseException, path: str) -> None:
    """Write ``error.failures`` (a ChildFailedError's) to ``path``; never raises."""
    from meshprof.rundir.worker_exits import WorkerExit, write_worker_exits

    with contextlib.suppress(Exception):
        exits = [
            WorkerExit(
                rank=int(rank),
                local_rank=int(f.local_rank),
                pid=int(f.pid),
                exit_code=int(f.exitcode),
                time_ns=int(f.timestamp) * 1_000_000_000,
                message=str(f.message or ""),
            )
            for rank, f in sorted(getattr(error, "failures", {}).items())
        ]
        write_worker_exits(path, exits)


def die_with_launcher(launcher_pid: int) -> bool:
    """SIGTERM this process when its parent (the launcher) dies; True when set. When the
    launcher is already gone (it died before this ran) the SIGTERM is sent at once."""
    if launcher_pid <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
        if os.getppid() != launcher_pid:
            os.kill(os.getpid(), signal.SIGTERM)
        return True
    except (OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    settings = WorkerSettings.from_env(os.environ)
    if settings is not None:
        die_with_launcher(settings.launcher_pid)
    prepare_in_torchrun()  # the native recorder, before the workers start
    report_versions()  # for the launcher's manifest (torch is imported here anyway)
    try:
        torchrun_main(sys.argv[1:] if argv is None else argv)
    except ChildFailedError as e:
        if settings is not None and settings.worker_exits:
            save_failures(e, settings.worker_exits)
        raise


if __name__ == "__main__":
    main()
