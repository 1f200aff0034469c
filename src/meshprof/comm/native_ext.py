"""Where and when the native (C++) recorder is built, and loading it.

The extension is compiled from ``native_kernel.cpp`` with ``torch.utils.cpp_extension`` into
``<root>/<name>/`` where ``root`` is ``TORCH_EXTENSIONS_DIR`` (else torch's default cache) and
``name`` encodes what the binary depends on: the Python version, the torch version, its C++ ABI
and a hash of the source (:func:`extension_name`), so two torch builds, or two meshprof
versions, never share (and keep rebuilding) one build. A successful build leaves a ``built``
stamp next to the library; a later process imports the library directly (no compiler, no
ninja: :func:`cached`, :func:`load`).

One build per host: the build runs under an exclusive lock on ``<root>/<name>.lock``
(:func:`meshprof.native_build.host_lock`, shared with the replay's C loop), so ranks that start
together build once and the others wait for it, then import it. When the build fails, the processes that were waiting for that attempt do not retry
(the failure is stamped with its time); a background build in a process started within
:data:`RETRY_FAILED_AFTER_S` of a failure does not retry either (every test or rank process of a
machine without a compiler would otherwise try), while an explicit build (``meshprof
build-native``, ``meshprof run``, ``native=True``) always does.

:class:`BackgroundBuild` runs the build on a daemon thread (``meshprof.enable()`` without a
cached build records with the Python kernel meanwhile and hands over when it finishes);
``meshprof build-native`` and ``meshprof run`` build in the foreground.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshprof.errors import MeshprofError
from meshprof.native_build import host_lock

SOURCE = Path(__file__).with_name("native_kernel.cpp")
HEADERS = ("native_device.h", "native_args.h")
"""Headers ``native_kernel.cpp`` includes (their bytes are in the cache name's hash too)."""
_STAMP = "built"
_FAILED = "failed"
LOG = "build.log"
"""The build's output (compiler, ninja, torch's messages), beside the library; ``meshprof
doctor`` reports its warnings."""

#: Seconds after a failed build during which background builds do not try again.
RETRY_FAILED_AFTER_S = 3600.0

_lock = threading.Lock()
_module: Any = None


def extension_name() -> str:
    """The module name of this torch build's extension, e.g.
    ``meshprof_native_py311_torch2_13_0_cpu_abi1_3f2a9c1d`` (a valid identifier)."""
    import torch

    tv = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False)))
    h = hashlib.sha256(SOURCE.read_bytes())
    for name in HEADERS:
        h.update(SOURCE.with_name(name).read_bytes())
    cuda = "_cuda" if build_with_cuda() else ""
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return f"meshprof_native_{py}_torch{tv}_abi{abi}{cuda}_{h.hexdigest()[:8]}"


def build_with_cuda() -> bool:
    """Build the CUDA device timing in: CUDA is usable here and the CUDA toolkit's headers are
    found (``CUDA_HOME``)."""
    import torch

    if not torch.cuda.is_available():
        return False
    return bool(_cpp_extension().CUDA_HOME)


def build_root() -> Path:
    """``TORCH_EXTENSIONS_DIR``, else torch's default extension cache."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    return Path(default_build_root())


def default_build_root() -> str:
    """torch's ``cpp_extension.get_default_build_root()`` (the user's ``torch_extensions``
    cache folder), computed as torch does without importing ``torch.utils.cpp_extension``: every
    rank asks where the extension is, and that import costs ~60 ms of CPU per process. Falls
    back to torch's function when its private ``torch._appdirs`` is gone."""
    try:
        from torch._appdirs import user_cache_dir
    except ImportError:
        return str(_cpp_extension().get_default_build_root())
    return os.path.realpath(user_cache_dir(appname="torch_extensions"))


def build_dir() -> Path:
    """Where this torch build's extension is (or will be) built."""
    return build_root() / extension_name()


def library_path() -> Path:
    """The compiled module inside :func:`build_dir`."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[-1]  # ".so" (cpp_extension's naming)
    return build_dir() / f"{extension_name()}{suffix}"


def cached() -> bool:
    """Whether a finished build of this torch build's extension is in the cache."""
    return (build_dir() / _STAMP).is_file() and library_path().is_file()


def loaded() -> bool:
    """Whether this process has imported the extension already."""
    return _module is not None


#: What importing ``torch.utils.cpp_extension`` logged in this process (e.g. torch's "No CUDA
#: runtime is found" on a CPU node with a CUDA toolkit): kept here, not printed on every rank.
IMPORT_MESSAGES: list[str] = []


def _cpp_extension() -> Any:
    """``torch.utils.cpp_extension``, imported with its import-time log records (a warning per
    rank on a CPU node with ``CUDA_HOME``) kept in :data:`IMPORT_MESSAGES` instead of printed.
    Only that logger is touched: other threads' output is not."""
    mod = sys.modules.get("torch.utils.cpp_extension")
    if mod is not None:
        return mod
    import logging

    log = logging.getLogger("torch.utils.cpp_extension")

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if len(IMPORT_MESSAGES) < 32:
                IMPORT_MESSAGES.append(f"{record.levelname}: {record.getMessage()}")

    keep, propagate = _Keep(), log.propagate
    log.addHandler(keep)
    log.propagate = False
    try:
        import torch.utils.cpp_extension as mod
    finally:
        log.removeHandler(keep)
        log.propagate = propagate
    return mod


def _compile_here() -> None:
    """Compile (or let ninja bring up to date) the extension into :func:`build_dir`, in this
    process (the child that :func:`_compile` starts)."""
    d = build_dir()
    d.mkdir(parents=True, exist_ok=True)
    cuda = build_with_cuda()
    for m in IMPORT_MESSAGES:
        print(m, flush=True)
    _cpp_extension().load(
        name=extension_name(),
        sources=[str(SOURCE)],
        extra_cflags=["-O2"] + (["-DMESHPROF_WITH_CUDA"] if cuda else []),
        with_cuda=cuda,
        build_directory=str(d),
        verbose=True,
    )


def _compile() -> None:
    """Compile the extension in a child Python whose output (compiler warnings, ninja, torch's
    messages) goes to :data:`LOG` in the build directory, never to the training's terminal;
    ``$MESHPROF_NATIVE_VERBOSE`` also copies it to stderr. Raises RuntimeError with the log's
    last lines when the build fails."""
    import subprocess

    d = build_dir()
    d.mkdir(parents=True, exist_ok=True)
    log = d / LOG
    with open(log, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-c", "from meshprof.comm.native_ext import _compile_here as c; c()"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    text = log.read_text(errors="replace")
    if os.environ.get("MESHPROF_NATIVE_VERBOSE"):
        sys.stderr.write(text)
    if proc.returncode != 0:
        tail = " | ".join(ln.strip() for ln in text.strip().splitlines()[-4:])
        raise RuntimeError(f"exit {proc.returncode}, see {log}: {tail}")


def last_failure() -> str | None:
    """Why the last build of this torch build's extension failed (None: it did not, or it was
    not tried)."""
    try:
        return (build_dir() / _FAILED).read_text(errors="replace").strip() or None
    except OSError:
        return None


def build_warnings(limit: int = 10) -> list[str]:
    """The warning lines of the last build's :data:`LOG` (compiler and torch warnings), at most
    ``limit``; empty when there is no log or nothing to report."""
    try:
        text = (build_dir() / LOG).read_text(errors="replace")
    except OSError:
        return []
    keys = ("warning", "No CUDA runtime")
    out = [ln.strip() for ln in text.splitlines() if any(k in ln for k in keys)]
    return out[:limit]


def ensure_built(compile_fn: Callable[[], None] | None = None, retry_failed: bool = True) -> Path:
    """Build this torch build's extension once per host (under the lock) unless it is cached;
    returns its directory. MeshprofError says why it could not be built. ``compile_fn``
    replaces the compiler (tests); ``retry_failed=False`` (background builds) gives up when a
    build failed less than :data:`RETRY_FAILED_AFTER_S` ago."""
    d = build_dir()
    if cached():
        return d
    started = time.time()
    with host_lock(build_root() / f"{extension_name()}.lock") as waited:
        if cached():  # another process built it while we waited
            return d
        failed = d / _FAILED
        if failed.is_file():
            age = failed.stat().st_mtime
            recent = not retry_failed and age >= started - RETRY_FAILED_AFTER_S
            if (waited and age >= started) or recent:
                msg = failed.read_text(errors="replace").strip()
                raise MeshprofError(msg + ("" if waited else " (meshprof build-native retries)"))
        try:
            (compile_fn or _compile)()
        except Exception as e:
            msg = (
                f"the native recorder could not be built ({type(e).__name__}: {str(e)[:300]}); "
                "it needs a C++ compiler and torch's headers"
            )
            with contextlib.suppress(OSError):
                d.mkdir(parents=True, exist_ok=True)
                failed.write_text(msg)
            raise MeshprofError(msg) from None
        (d / _STAMP).write_text(f"{time.time():.3f}\n")
        with contextlib.suppress(OSError):
            failed.unlink()
    return d


def _import() -> Any:
    name = extension_name()
    spec = importlib.util.spec_from_file_location(name, library_path())
    if spec is None or spec.loader is None:
        raise ImportError(f"no module at {library_path()}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load(retry_failed: bool = True) -> Any:
    """The extension module: imported from the cache, built first (under the host lock) when
    it is not there. MeshprofError says why it cannot be had (``retry_failed``: see
    :func:`ensure_built`)."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        try:
            ensure_built(retry_failed=retry_failed)
        except MeshprofError:
            raise
        except Exception as e:  # an unwritable cache directory, a lock that fails
            raise MeshprofError(
                f"the native recorder could not be built in {build_dir()} "
                f"({type(e).__name__}: {str(e)[:300]})"
            ) from None
        try:
            _module = _import()
        except Exception as e:
            raise MeshprofError(
                f"the native recorder built in {build_dir()} could not be loaded "
                f"({type(e).__name__}: {str(e)[:300]})"
            ) from None
        return _module


class BackgroundBuild:
    """Builds and loads the extension on a daemon thread, then calls ``on_done(error)``
    (``None`` on success, else the MeshprofError) from that thread."""

    def __init__(self, on_done: Callable[[MeshprofError | None], None]) -> None:
        self._on_done = on_done
        self.thread = threading.Thread(target=self._run, name="meshprof-native-build", daemon=True)
        self.done = threading.Event()
        self.error: MeshprofError | None = None

    def start(self) -> BackgroundBuild:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            load(retry_failed=False)
        except MeshprofError as e:
            self.error = e
        except Exception as e:  # never let the thread die with a traceback
            self.error = MeshprofError(f"the native recorder could not be built: {e}")
        self.done.set()
        with contextlib.suppress(Exception):
            self._on_done(self.error)


_background: BackgroundBuild | None = None


def build_in_background(on_done: Callable[[MeshprofError | None], None]) -> BackgroundBuild:
    """Start (once per process) the background build; a later caller's ``on_done`` is called
    when that same build ends (at once if it has ended)."""
    global _background
    with _lock:
        bg = _background
        if bg is None:
            bg = _background = BackgroundBuild(on_done).start()
            return bg
    callbacks_on_done(bg, on_done)
    return bg


def callbacks_on_done(bg: BackgroundBuild, on_done: Callable[[MeshprofError | None], None]) -> None:
    """Call ``on_done`` when ``bg`` ends, from a small waiting thread (at once if ended)."""
    if bg.done.is_set():
        on_done(bg.error)
        return

    def wait() -> None:
        bg.done.wait()
        with contextlib.suppress(Exception):
            on_done(bg.error)

    threading.Thread(target=wait, name="meshprof-native-wait", daemon=True).start()
