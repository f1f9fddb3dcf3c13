"""Experiment trackers behind ``Accelerator.init_trackers`` / ``log`` / ``end_training``.

Built in: ``"jsonl"`` (keeps every record in memory as ``records`` and appends it
to ``<logging_dir>/<project>/metrics.jsonl``) and ``"tensorboard"``; ``"wandb"`` and
``"mlflow"`` (``wandb_tracker.py``, ``mlflow_tracker.py``) need their optional
packages. Any object with ``store_init_configuration``, ``log`` and ``finish``
methods (and a ``name``) can be passed as well. Trackers are made on the main
process only (``Accelerator.init_trackers``).
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

from notebook_accel import events
from notebook_accel.machine import availability
from notebook_accel.wire import Kind

LOGGER_TYPE_TO_CLASS = {  # the peer's name: tracker name -> its class, as "module:Class"
    "jsonl": "notebook_accel.observe.tracking:JSONLTracker",
    "tensorboard": "notebook_accel.observe.tracking:TensorBoardTracker",
    "wandb": "notebook_accel.observe.wandb_tracker:WandBTracker",
    "mlflow": "notebook_accel.observe.mlflow_tracker:MLflowTracker",
}
_NEEDS_LOGGING_DIR = ("jsonl", "tensorboard")
TRACKERS = tuple(LOGGER_TYPE_TO_CLASS)
_INSTALLED = {"jsonl": lambda: True, "tensorboard": availability.is_tensorboard_available,
              "wandb": availability.is_wandb_available, "mlflow": availability.is_mlflow_available}


def available_trackers() -> list[str]:
    """The trackers that can be built here (``jsonl`` always; the others when their package is installed).

    ``log_with="all"`` means these, as in the peer.
    """
    return [name for name in TRACKERS if _INSTALLED[name]()]


def tracker_class(name: str) -> type:
    """The class of the tracker called ``name`` (its optional package is imported when it is built).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in LOGGER_TYPE_TO_CLASS:
        raise ValueError(f"log_with={name!r} is not a known tracker; choose from {list(LOGGER_TYPE_TO_CLASS)} "
                         "or 'all' (those installed), or pass a tracker object")
    found = LOGGER_TYPE_TO_CLASS[name]
    if isinstance(found, type):  # registered by register_tracker_class
        return found
    module, _, cls = found.partition(":")
    return getattr(importlib.import_module(module), cls)


def register_tracker_class(tracker_class: type) -> None:
    """Make a ``GeneralTracker`` subclass usable by its ``name`` in ``log_with``, as a built-in one.

    ``init_trackers`` builds it as ``cls(project_name, **init_kwargs.get(name, {}))``, with the
    logging directory as second argument when its ``requires_logging_directory`` is true.

    Raises:
        ValueError: not a ``GeneralTracker`` subclass, or no ``name`` / ``requires_logging_directory``.
    Warns ``UserWarning`` when it replaces a tracker of that name.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class needs a GeneralTracker subclass, got {tracker_class!r}")
    name = tracker_class.__dict__.get("name") or getattr(tracker_class, "name", None)
    if not name or name == GeneralTracker.name:
        raise ValueError(f"{tracker_class.__name__} needs a non-empty class attribute `name`")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(f"{tracker_class.__name__} needs a class attribute `requires_logging_directory` "
                         "(True when it is built with a logging directory)")
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(f"register_tracker_class: {tracker_class.__name__} replaces the tracker {name!r}",
                      UserWarning, stacklevel=2)
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def _needs_logging_dir(name: str) -> bool:
    found = LOGGER_TYPE_TO_CLASS.get(name)
    return name in _NEEDS_LOGGING_DIR or bool(getattr(found, "requires_logging_directory", False))


def check_log_with(log_with: Any, logging_dir: str | os.PathLike[str] | None) -> None:
    """Refuse, when the Accelerator is made, a registered tracker that needs a logging directory
    while none is set (``project_dir`` or ``ProjectConfiguration(logging_dir=...)``)."""
    for item in log_with if isinstance(log_with, (list, tuple)) else [log_with]:
        found = LOGGER_TYPE_TO_CLASS.get(item) if isinstance(item, str) else None
        if getattr(found, "requires_logging_directory", False) and logging_dir is None:
            raise ValueError(f"log_with={item!r} needs a logging directory: pass project_dir=... or "
                             "project_config=ProjectConfiguration(logging_dir=...)")


def __getattr__(name: str) -> Any:
    """``WandBTracker`` and ``MLflowTracker`` at the peer's path, ``accelerate.tracking``."""
    for path in LOGGER_TYPE_TO_CLASS.values():
        module, _, cls = path.partition(":")
        if cls == name:
            return getattr(importlib.import_module(module), cls)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

    @property
    def tracker(self) -> Any:
        """The library's own object behind this tracker (``get_tracker(name, unwrap=True)``)."""
        return None

    def start(self) -> None:
        """Open the run (deferred initialisation): ``init_trackers`` calls it once, before anything is logged."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyper-parameters."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` at ``step``."""

    def finish(self) -> None:
        """Flush and close."""


class BlankTracker(GeneralTracker):
    """What ``get_tracker`` gives the processes that start no tracker: every method is a no-op
    (``log_table``, ``log_images``... too, so main-process-only calls need no guard)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


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

    @property
    def tracker(self) -> Any:
        return self.writer

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

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log each batch of images (``add_images``: N×C×H×W by default) under its key."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
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
    if "all" in wanted:
        wanted = available_trackers() + [item for item in wanted if not isinstance(item, str)]
    init_kwargs = init_kwargs or {}
    trackers: list[Any] = []
    for item in wanted:
        if not isinstance(item, str):
            trackers.append(item)
            continue
        cls = tracker_class(item)
        args = (project_name, logging_dir) if _needs_logging_dir(item) else (project_name,)
        trackers.append(cls(*args, **init_kwargs.get(item, {})))
    return trackers
