"""Who already holds this machine's TPU, named before a launch instead of found after a hang.

libtpu lets one process own the chips. It takes ``/tmp/libtpu_lockfile`` and opens the chips'
device files (``/dev/accel*`` on v4, ``/dev/vfio/N`` on v5e and later); a second process that
starts the TPU runtime then waits, or fails deep in torch_xla's workers. The holder can be this
kernel (jax, preinstalled on Colab's TPU runtime, initialised its TPU backend: the XLA runtime
check of :mod:`~notebook_accel.machine.tpu` does not see jax) or another process (another
notebook's kernel, a script). Everything here reads ``sys.modules`` and ``/proc``: nothing
imports jax or starts a runtime.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"


def jax_holds_tpu(modules: Mapping[str, ModuleType] | None = None) -> bool:
    """Whether jax, imported in this process, has initialised its TPU backend (never imports jax:
    a jax that was not imported, or has not started a backend yet, holds nothing)."""
    modules = sys.modules if modules is None else modules
    bridge = modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None) or {}
    return "tpu" in backends


def _holds(target: str, lockfile: str) -> bool:
    return (target == lockfile or target.startswith("/dev/accel")
            or (target.startswith("/dev/vfio/") and target.rsplit("/", 1)[1].isdigit()))


def tpu_holders(proc_root: str | os.PathLike[str] = "/proc", lockfile: str = LIBTPU_LOCKFILE,
                exclude: frozenset[int] | None = None) -> dict[int, str]:
    """Other processes holding the TPU: pid -> its command line, for each that has libtpu's lock
    file or a TPU device file open (what ``lsof``/``fuser`` would say; processes of other users
    cannot be looked into, as without root). ``exclude``: pids to leave out (default: this one)."""
    exclude = frozenset({os.getpid()}) if exclude is None else exclude
    found: dict[int, str] = {}
    for entry in Path(proc_root).iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if _holds(target, lockfile):
                found[int(entry.name)] = _command(entry)
                break
    return found


def _command(entry: Path) -> str:
    try:
        words = (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(w.decode(errors="replace") for w in words if w)[:120] or "?"


def tpu_held_message(interactive: bool = True, modules: Mapping[str, ModuleType] | None = None,
                     holders: dict[int, str] | None = None) -> str | None:
    """Why the workers could not get the TPU (jax in this kernel, or other processes, named with
    their pids), or None when nothing is seen holding it. ``holders``: read when None."""
    if jax_holds_tpu(modules):
        fix = ("Restart the kernel and run the jax code in another runtime, or after the launch"
               if interactive else "Start the launch before jax uses the TPU in this process")
        return ("jax in this kernel has initialised its TPU backend (a jax array or jax.devices() "
                "was used here), so this process holds the TPU chips and torch_xla's workers "
                f"would wait for them. {fix}; or set JAX_PLATFORMS=cpu before importing jax.")
    holders = tpu_holders() if holders is None else holders
    if holders:
        named = "; ".join(f"pid {pid} ({command})" for pid, command in sorted(holders.items()))
        return (f"the TPU is held by another process: {named} (it has {LIBTPU_LOCKFILE} or a TPU "
                "device file open), so torch_xla's workers would wait for it. Stop that process "
                "(another notebook's kernel: shut it down), then launch again.")
    return None
