"""Experiment trackers behind ``Accelerator.init_trackers`` / ``log`` / ``end_training``.

Built in: ``"jsonl"`` (keeps every record in memory as ``records`` and appends it
to ``<logging_dir>/<project>/metrics.jsonl``) and ``"tensorboard"`` (needs the
optional ``tensorboard`` package). Any object with ``store_init_configuration``,
``log`` and ``finish`` methods (and a ``name``) can be passed as well.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from notebook_accel import events
from notebook_accel.wire import Kind

TRACKERS = ("jsonl", "tensorboard")


def stream_to_kernel(values: dict[str, Any], step: int | None) -> None:
    """Send the numeric ``values`` to the kernel that launched this worker (live plots,
    ``last_launch().history``); a no-op outside ``notebook_launcher``."""
    if not events.active():
        return
    numbers = {}
    for name, value in values.items():
        if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers[str(name)] = float(value)
    if numbers:
        events.emit(Kind.METRICS, {"step": step, "values": numbers})


class GeneralTracker:
    """Base class for trackers; subclasses override what they support."""

    name = "general"

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyper-parameters."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` at ``step``."""

    def finish(self) -> None:
        """Flush and close."""


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (ValueError, RuntimeError):
            return value.tolist()
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


class JSONLTracker(GeneralTracker):
    """Keeps records in memory and appends them to a JSON-lines file.

    Args:
        run_name: the project name (a sub-directory of ``logging_dir``).
        logging_dir: where to write; ``None`` keeps the records in memory only.
    """

    name = "jsonl"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None) -> None:
        self.run_name = run_name
        self.records: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {}
        self.path: Path | None = None
        self._file = None
        if logging_dir is not None:
            self.path = Path(logging_dir) / run_name / "metrics.jsonl"
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in finish()

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.config = {k: _jsonable(v) for k, v in values.items()}
        self._write({"config": self.config})

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        record = {"step": step, **{k: _jsonable(v) for k, v in values.items()}}
        self.records.append(record)
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardTracker(GeneralTracker):
    """Logs scalars (and text) through ``torch.utils.tensorboard.SummaryWriter``.

    Raises:
        ImportError: when the optional ``tensorboard`` package is missing.
    """

    name = "tensorboard"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "log_with='tensorboard' needs the tensorboard package: pip install tensorboard"
            ) from exc
        log_dir = Path(logging_dir or "runs") / run_name
        self.writer = SummaryWriter(str(log_dir), **kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.add_text("config", json.dumps({k: _jsonable(v) for k, v in values.items()}))
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            value = _jsonable(value)
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


def make_trackers(
    log_with: Any, project_name: str, logging_dir: str | os.PathLike[str] | None,
    init_kwargs: dict[str, dict[str, Any]] | None = None,
) -> list[Any]:
    """Build the trackers named (or given) in ``log_with``.

    Raises:
        ValueError: an unknown tracker name, listing the valid ones.
    """
    if log_with is None:
        return []
    wanted = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    init_kwargs = init_kwargs or {}
    trackers: list[Any] = []
    for item in wanted:
        if not isinstance(item, str):
            trackers.append(item)
        elif item == "jsonl":
            trackers.append(JSONLTracker(project_name, logging_dir, **init_kwargs.get("jsonl", {})))
        elif item == "tensorboard":
            trackers.append(TensorBoardTracker(project_name, logging_dir, **init_kwargs.get("tensorboard", {})))
        else:
            raise ValueError(f"log_with={item!r} is not a known tracker; choose from {TRACKERS} or pass a tracker object")
    return trackers
