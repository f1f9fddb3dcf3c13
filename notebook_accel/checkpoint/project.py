"""``ProjectConfiguration``: where an ``Accelerator`` keeps logs and checkpoints, and the automatic
checkpoints' names (``checkpoints/checkpoint_<iteration>``) and limit (the peer's names)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ProjectConfiguration:
    """Where an ``Accelerator`` keeps logs and checkpoints (the peer's names).

    Attributes:
        project_dir: base directory.
        logging_dir: tracker output; defaults to ``project_dir``.
        automatic_checkpoint_naming: ``save_state()`` without a directory writes
            ``<project_dir>/checkpoints/checkpoint_<iteration>``; ``load_state()`` loads the latest.
        total_limit: keep at most this many automatic checkpoints (oldest removed).
        iteration: the number the next automatic checkpoint gets.
        save_on_each_node: ``Accelerator.save`` writes on each machine's local main process
            (machines without a shared file system), not only on the main process. ``save_state``
            needs no such switch: it writes a complete copy on every file system by itself.
    """

    project_dir: str | os.PathLike[str] | None = None
    logging_dir: str | os.PathLike[str] | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def resolve(self, path: str | os.PathLike[str] | None, saving: bool) -> Path:
        """The directory ``save_state`` / ``load_state`` use when given ``path`` (maybe ``None``).

        Raises:
            ValueError: no path and no ``project_dir``.
            FileNotFoundError: loading the latest automatic checkpoint when there is none.
        """
        if path is not None:
            return Path(path)
        if self.automatic_checkpoint_naming:
            if saving:
                return self.next_dir()
            existing = self.checkpoints()
            if not existing:
                raise FileNotFoundError(f"no automatic checkpoint under {self.project_dir}/checkpoints")
            return existing[-1]
        if self.project_dir is None:
            raise ValueError("save_state/load_state need a directory, or Accelerator(project_dir=...)")
        return Path(self.project_dir) / "checkpoint"

    def checkpoints(self) -> list[Path]:
        """Existing automatic checkpoints, oldest first."""
        if self.project_dir is None:
            return []
        base = Path(self.project_dir) / "checkpoints"
        found = []
        for path in base.glob("checkpoint_*"):
            suffix = path.name.removeprefix("checkpoint_")
            if path.is_dir() and suffix.isdigit():
                found.append((int(suffix), path))
        return [p for _, p in sorted(found)]

    def next_dir(self) -> Path:
        """The directory of the next automatic checkpoint."""
        if self.project_dir is None:
            raise ValueError("automatic_checkpoint_naming needs a project_dir")
        return Path(self.project_dir) / "checkpoints" / f"checkpoint_{self.iteration}"

    def prune(self) -> None:
        """Delete the oldest automatic checkpoints beyond ``total_limit`` (main process only)."""
        if self.total_limit is None:
            return
        existing = self.checkpoints()
        for path in existing[: max(len(existing) - self.total_limit, 0)]:
            shutil.rmtree(path, ignore_errors=True)
