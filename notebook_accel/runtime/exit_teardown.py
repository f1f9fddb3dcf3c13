"""Tear the process group down at interpreter exit, while the interpreter is still whole.

Why: under ``torchrun`` (or any launcher that lets the script end normally), a gloo
worker thread (``pt_gloo_runloop``) can still be releasing the last collective of the
last backward pass when the main thread starts finalising the interpreter. That work
holds a Python object (the ``contextvars`` context torch stashes in thread-local state
for every backward), so its destructor needs the GIL; asking for the GIL during
finalisation ends the thread with a forced unwind through a ``noexcept`` destructor,
and the process aborts with ``terminate called without an active exception`` (SIGABRT)
after its work is done. It is torch's race (see docs/torch_gloo_exit_abort.md and
pytorch/pytorch#179291), not the user's; this module closes it for our runtime.

How: an ``atexit`` handler, registered the first time this process joins a process
group, runs before finalisation (and after atexit handlers registered later, such as
the user's). It destroys the process group (gloo joins its threads there when nothing
else holds the group), then lets go of the GIL until torch's communication threads are
idle, so a thread waiting to release a Python object can finish first. Workers of
``notebook_launcher`` leave with ``os._exit`` and never run it.
"""

from __future__ import annotations

import atexit
import os
import sys
import time

import torch.distributed as dist

_registered = False

# Names torch gives the threads that run collectives and release their work objects.
_COMM_THREAD_PREFIXES = ("pt_gloo", "gloo_", "pt_nccl")
_SETTLE_MIN_S = 0.05
_SETTLE_MAX_S = 2.0
_SETTLE_POLL_S = 0.01
_QUIET_SAMPLES = 3


def register() -> None:
    """Arrange, once per process, for the process group to be torn down cleanly at exit (the
    torch-native device kind asks, ``runtime.device``; XLA's runtime owns its own threads)."""
    global _registered
    if _registered:
        return
    _registered = True
    atexit.register(_tear_down)


def _tear_down() -> None:
    # idle first: destroying the group can leave DDP's reducers holding the last reference,
    # and freeing one joins gloo's threads with the GIL held (a deadlock if one still needs it)
    settle_comm_threads()
    if dist.is_available() and dist.is_initialized() and _safe_to_destroy():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001  exiting anyway: never turn a clean exit into an error
            pass
    settle_comm_threads()


def _safe_to_destroy() -> bool:
    """gloo tears down locally; nccl's teardown can wait on peers, so only after a clean run."""
    if dist.get_backend() == "gloo":
        return True
    return getattr(sys, "last_value", None) is None


def settle_comm_threads(min_s: float = _SETTLE_MIN_S, max_s: float = _SETTLE_MAX_S) -> float:
    """Sleep (GIL released) until torch's communication threads are idle; return seconds waited.

    Idle means: every such thread was seen sleeping in ``_QUIET_SAMPLES`` samples in a
    row, taken with the GIL released in between, so a thread that was waiting for the
    GIL has had it. Waits at least ``min_s`` and at most ``max_s``.
    """
    start = time.monotonic()
    quiet = 0
    while True:
        time.sleep(_SETTLE_POLL_S)
        elapsed = time.monotonic() - start
        quiet = quiet + 1 if _comm_threads_sleeping() else 0
        if (quiet >= _QUIET_SAMPLES and elapsed >= min_s) or elapsed >= max_s:
            return elapsed


def _comm_threads_sleeping() -> bool:
    """True when no communication thread of this process is running or runnable (Linux)."""
    task_dir = "/proc/self/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:  # not Linux: no way to look, rely on the minimum wait
        return True
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat") as stat:
                fields = stat.read()
        except OSError:  # the thread just ended
            continue
        name = fields[fields.find("(") + 1 : fields.rfind(")")]
        state = fields[fields.rfind(")") + 2 : fields.rfind(")") + 3]
        if name.startswith(_COMM_THREAD_PREFIXES) and state not in ("S", "I"):
            return False
    return True
