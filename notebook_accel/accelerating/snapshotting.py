"""The ``Accelerator``'s background snapshots and ``resume`` (the mechanics: ``checkpoint.snapshots``,
``checkpoint.resume``, ``checkpoint.snapshot_place``)."""

from __future__ import annotations

import os
from pathlib import Path

from notebook_accel import contract
from notebook_accel.checkpoint import resume, snapshot_place, snapshots
from notebook_accel.flags import env_flag


class Snapshotting:
    """``snapshot_every``, ``resume``, ``resumed_step`` and ``wait_for_snapshots``; the schedule is
    ``self._snapshots`` (None until asked) and the step resumed from ``self._resumed_at``."""

    _snapshots: snapshots.Snapshots | None
    _resumed_at: int
    project_dir: Path | None

    def _snapshots_from_launch(self) -> None:
        """The launch option ``snapshot_every`` (the workers get it in ``NOTEBOOK_ACCEL_SNAPSHOT_EVERY``):
        snapshots every N steps into the default directory, as ``snapshot_every(steps=N)``."""
        value = os.environ.get(contract.SNAPSHOT_EVERY_ENV, "").strip()
        if not value:
            return
        where = f"snapshot_every={value!r} (environment variable {contract.SNAPSHOT_EVERY_ENV})"
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{where}: must be an integer >= 1 (optimizer steps between snapshots)")
        try:
            self.snapshot_every(steps=int(value))
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None

    def snapshot_every(self, steps: int | None = None, seconds: float | None = None,
                       dir: str | os.PathLike[str] | None = None, keep: int = 2,  # noqa: A002 - the issue's name
                       in_peers: bool | None = None) -> None:
        """Snapshot the training state every ``steps`` optimizer steps and/or ``seconds``, in the background.

        At the end of a step where one falls due, everything ``save_state`` saves (models, optimizers,
        schedulers, RNG, registered objects, the loaders' positions, the step) is copied to host memory;
        only that copy holds training up. Each rank then writes its part in a background thread, in
        ``save_state``'s layout, into ``dir/snapshot_<step>``, atomically (a half-written snapshot is
        never the newest); the newest ``keep`` are kept. ``resume()`` loads the newest. Every process
        must call it (after or before ``prepare``).

        Args:
            steps: every this many optimizer steps (of every prepared optimizer; accumulation's
                micro-steps are not steps).
            seconds: when this many seconds have passed since the last snapshot (rank 0's clock).
            dir: any local path every rank sees (a mounted Drive folder is one); default the
                launch option ``snapshot_dir`` (``snapshot_dir:`` in the config file), else
                ``<project_dir>/snapshots``, else ``./snapshots/<run>`` (``$NOTEBOOK_ACCEL_RUN_NAME``,
                else ``default``).
            keep: how many complete snapshots to keep.
            in_peers: also keep the newest snapshot in the peers' memory, for a warm pool's heal
                (default: the launch option ``snapshot_in_peers``): each rank keeps its part (the host
                copy, serialised) and sends a copy to rank ``(r + 1) % world`` in the background, so a
                rank lost with its shards (FSDP2) is brought back without disk; the next ``resume()``
                loads it. Memory: each rank holds its own part and its neighbour's, about twice its
                host copy (with FSDP2 about ``2 * state_bytes / world``; with DDP rank 0's part holds
                the whole model and optimizer, so rank 0 and rank 1 hold one copy each); said at the
                first snapshot. Two neighbouring ranks lost together fall back to the disk.

        Raises:
            ValueError: neither ``steps`` nor ``seconds``, a bad value, ``in_peers`` with DeepSpeed
                (its engine writes files), or a directory some rank does not see.

        Example:
            >>> accelerator.snapshot_every(steps=200)
            >>> for step in range(accelerator.resume(), total_steps):
            ...     ...
        """
        directory = snapshot_place.snapshot_directory(self.project_dir, dir)
        if self._snapshots is not None:
            self._snapshots.wait()
        if in_peers is None:
            in_peers = env_flag(contract.SNAPSHOT_IN_PEERS_ENV)
        self._snapshots = snapshots.Snapshots(self, steps, seconds, directory, keep, in_peers)
        self._snapshots.restart_at(self._resumed_at)
        if self._snapshots.in_peers:
            self.print(self._snapshots.describe())

    def resume(self, dir: str | os.PathLike[str] | None = None) -> int:  # noqa: A002 - as snapshot_every's
        """Load the newest complete snapshot (``snapshot_every``'s directory, or ``dir``, or the default
        one) and return the optimizer step to go on from (0 if there is none), saying so in one line.

        The prepared loaders' next pass leaves out the batches already seen, so a loop reads
        ``for step in range(accelerator.resume(), total_steps)``. Call it after ``prepare`` (every
        process). A snapshot of another world size, strategy or model shape is refused (``ValueError``
        naming the difference).
        """
        self._resumed_at = resume.resume(self, self._snapshot_directory(dir))
        if self._snapshots is not None:
            self._snapshots.restart_at(self._resumed_at)
        return self._resumed_at

    @property
    def resumed_step(self) -> int:
        """The optimizer step the last resume went on from (``resume()``, or ``Accelerator(resume="auto")``
        once ``prepare`` has loaded the snapshot); 0 when nothing was resumed. The loop:
        ``for step in range(accelerator.resumed_step, total_steps)``."""
        return self._resumed_at

    def _snapshot_directory(self, dir: str | os.PathLike[str] | None = None) -> Path:  # noqa: A002
        """``dir``, else the snapshot schedule's directory, else the default one (``snapshot_place``)."""
        if dir is None and self._snapshots is not None:
            return self._snapshots.directory
        return snapshot_place.snapshot_directory(self.project_dir, dir)

    def wait_for_snapshots(self) -> None:
        """Wait until the snapshot being written (if any) is on disk."""
        if self._snapshots is not None:
            self._snapshots.wait()
