"""Choose how workers are started: fork when it is safe, a warm forkserver when not.

``fork`` copies the kernel (cheap) but a forked child cannot use CUDA or XLA once
the parent initialised them. Driver-level initialisation (a library calling
``cuInit`` directly) is invisible to ``torch.cuda.is_initialized()``, so we also
look at what this process has mapped and opened.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from notebook_accel.contract import START_METHODS

__all__ = ["FORKSERVER_PRELOAD", "START_METHODS", "StartChoice", "choose_start_method",
           "fork_unsafe_reason", "get_context", "starter_pid"]

# Modules the forkserver imports once, so workers forked from it start warm.
FORKSERVER_PRELOAD = ["notebook_accel.launch.worker.warm"]


@dataclass(frozen=True)
class StartChoice:
    method: str  # "fork" | "forkserver" | "spawn"
    reason: str  # why, when it is not what the user might expect; "" otherwise


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _open_device_files(fd_dir: str = "/proc/self/fd") -> list[str]:
    targets = []
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return targets
    for name in names:
        try:
            targets.append(os.readlink(os.path.join(fd_dir, name)))
        except OSError:
            continue
    return targets


def fork_unsafe_reason(maps: str | None = None, open_files: list[str] | None = None) -> str | None:
    """Why forking this process would break the workers, or None when fork is safe.

    Args:
        maps: text of ``/proc/self/maps`` (read when None).
        open_files: targets of this process's open file descriptors (read when None).
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in this kernel"
    maps = _read("/proc/self/maps") if maps is None else maps
    if "libcuda.so" in maps:
        return "the CUDA driver is loaded in this kernel (libcuda.so; a library called cuInit)"
    if open_files is None:
        open_files = _open_device_files()
    if any(target.startswith("/dev/nvidia-uvm") for target in open_files):
        return "the CUDA driver is in use in this kernel (/dev/nvidia-uvm is open)"
    if "torch_xla" in sys.modules and (
        "libtpu" in maps or any(t.startswith(("/dev/accel", "/dev/vfio/")) for t in open_files)
    ):
        return "the XLA runtime is initialised in this kernel"
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return "a torch.distributed process group exists in this kernel"
    return None


_OPENMP_PROBE_S = 1.0  # a fresh child's first parallel op takes milliseconds; a broken one never ends
_openmp_started = False  # once started, OpenMP's pool stays for the life of the process


def openmp_pool_started() -> bool:
    """Whether this process has started OpenMP's thread pool (GNU libgomp, torch's CPU threads),
    which a forked child cannot use: its first parallel op with more than one thread waits forever
    for threads that did not survive the fork. Found by forking a probe that tries one (a few ms;
    killed after ``_OPENMP_PROBE_S``); once true, it stays true without a probe."""
    global _openmp_started
    torch = sys.modules.get("torch")
    if _openmp_started or torch is None or "libgomp" not in _read("/proc/self/maps"):
        return _openmp_started
    pid = os.fork()
    if pid == 0:  # the probe: one parallel op on two threads, then out
        try:
            torch.set_num_threads(2)
            torch.ones(1 << 18).add_(1)
        finally:
            os._exit(0)
    deadline = time.monotonic() + _OPENMP_PROBE_S
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    _openmp_started = True
    return True


def choose_start_method(requested: str, worker_threads: Callable[[], int | None] | None = None) -> StartChoice:
    """Resolve ``requested`` (one of START_METHODS, checked by its row where it entered) to a
    concrete method; ``worker_threads()``: each worker's CPU threads, where known (more than one
    cannot be forked from a process whose OpenMP pool started; asked only where that pool may be).

    Raises:
        ValueError: ``fork`` requested when it is unsafe.
    """
    if requested in ("forkserver", "spawn"):
        return StartChoice(requested, "")
    reason = fork_unsafe_reason()
    # (without torch here there is no pool: the threads, which detect the hardware, are not asked)
    threads = worker_threads() if reason is None and worker_threads and "torch" in sys.modules else None
    if threads is not None and threads > 1 and openmp_pool_started():  # (the probe forks: only then)
        reason = (f"this kernel has run torch's CPU threads (OpenMP), which a forked worker cannot use "
                  f"with its {threads} threads")
    if reason is None:
        return StartChoice("fork", "")
    if requested == "fork":
        raise ValueError(
            f"start_method='fork' is unsafe here: {reason}, and forked workers would crash. "
            "Use start_method='auto' (or 'forkserver'), which starts workers from a clean "
            "process; no kernel restart needed."
        )
    return StartChoice("forkserver", f"{reason}, so workers start from a warm forkserver")


def starter_pid(method: str) -> int | None:
    """The pid of the process that will be the parent of workers started with ``method``:
    this one for fork and spawn, the forkserver (started now if need be) for forkserver.

    None when started from a thread other than the main one: the OS's parent-death signal
    follows the *thread* that forked, which may end long before the workers (a pool).
    """
    if method != "forkserver":
        return os.getpid() if threading.current_thread() is threading.main_thread() else None
    from multiprocessing import forkserver

    get_context(method)  # its preload list, before it starts
    forkserver.ensure_running()
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def get_context(method: str) -> multiprocessing.context.BaseContext:
    """The multiprocessing context for ``method``; the forkserver preloads torch and us."""
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
    return context
