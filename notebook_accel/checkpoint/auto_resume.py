"""``Accelerator(resume="auto")``: the newest complete snapshot loaded by ``prepare`` itself.

The snapshot is loaded at the end of the first ``prepare()`` call after which the Accelerator has
prepared its models and optimizers and at least as many of each kind of object (models,
optimizers, schedulers, loaders, registered objects) as the newest snapshot holds: so objects
prepared over several calls are all loaded, whichever call prepares the last of them. With no
snapshot, the first ``prepare`` holding models and optimizers says so, and training starts at 0.
Loading is ``Accelerator.resume()``'s (``checkpoint/resume``: the run shape checked, the loaders
skipping what was seen, one line said); the step it returns is ``accelerator.resumed_step``.

An optimizer step taken while the snapshot still waits for objects never prepared is refused,
naming them: training must not go on from step 0 over a run it was meant to continue.
"""

from __future__ import annotations

from typing import Any

from notebook_accel.checkpoint import snapshot_dir
from notebook_accel.runtime import ops

CHOICES = (None, "auto")
_KINDS = ("optimizers", "schedulers", "dataloaders", "custom_objects")


def check(value: Any) -> str | None:
    """``Accelerator(resume=...)``'s value, or a ValueError naming the valid ones."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    raise ValueError(f"Accelerator(resume={value!r}) is not one of {', '.join(repr(c) for c in CHOICES)}: "
                     "'auto' loads the newest complete snapshot after prepare(); None (the default) "
                     "leaves it to accelerator.resume()")


class AutoResume:
    """The pending load of ``Accelerator(resume="auto")`` (see the module docstring)."""

    def __init__(self, accelerator: Any) -> None:
        self.pending = True
        self._waiting: str | None = None  # the snapshot waiting for more objects, and what it lacks
        accelerator.print(f"resume='auto': once prepare() has the model and optimizer, this run goes on "
                          f"from the newest complete snapshot in {accelerator._snapshot_directory()}, if any "
                          "(accelerator.resumed_step)")

    def after_prepare(self, accelerator: Any) -> None:
        """Load the newest snapshot once every kind of object it holds is prepared (every rank)."""
        if not (self.pending and accelerator._models and accelerator._optimizers):
            return
        directory = accelerator._snapshot_directory()
        newest = snapshot_dir.newest(directory) if accelerator.is_main_process else None
        if accelerator.num_processes > 1:
            newest = ops.broadcast_object_list([newest])[0]
        missing = _missing(newest.meta or {}, accelerator) if newest is not None else ""
        if newest is not None and missing:
            self._waiting = f"the newest snapshot ({newest.path}, step {newest.step:,}) holds {missing}"
            for optimizer in accelerator._optimizers:  # first: before a snapshot's hook could take one
                if self._stepped not in optimizer.step_hooks:
                    optimizer.step_hooks.insert(0, self._stepped)
            return
        self.pending, self._waiting = False, None
        accelerator.resume()

    def _stepped(self, optimizer: Any) -> None:
        if not self.pending or self._waiting is None:
            return
        self.pending = False
        raise RuntimeError(
            f"resume='auto': {self._waiting}, not all prepared before the first optimizer step, so it "
            "was not loaded and training would start over at step 0. Prepare everything the snapshot's "
            "run prepared before training, or call accelerator.resume() yourself")


def _missing(meta: dict[str, Any], accelerator: Any) -> str:
    """What the snapshot holds that ``accelerator`` has not prepared yet, in words (``""``: none)."""
    here = {"models": len(accelerator._models), **{k: len(getattr(accelerator, "_" + k)) for k in _KINDS}}
    saved = {"models": len(meta.get("models", [])), **{k: int(meta.get(k, 0)) for k in _KINDS}}
    return ", ".join(f"{saved[k]} {k.replace('_', ' ')} (prepared: {here[k]})"
                     for k in here if saved[k] > here[k])
