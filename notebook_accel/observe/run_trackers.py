"""An ``Accelerator``'s trackers for one run: started on the main process, found by name, logged to, finished."""

from __future__ import annotations

import os
from typing import Any

from notebook_accel.observe import tracking


def start(log_with: Any, project_name: str, logging_dir: str | os.PathLike[str] | None,
          config: dict[str, Any] | None, init_kwargs: dict[str, dict[str, Any]] | None) -> list[Any]:
    """The ``log_with`` trackers, started (a custom tracker's deferred ``start``, the peer's hook), ``config`` stored."""
    trackers = tracking.make_trackers(log_with, project_name, logging_dir, init_kwargs)
    for tracker in trackers:
        if callable(getattr(tracker, "start", None)):
            tracker.start()
    for tracker in trackers if config is not None else ():
        tracker.store_init_configuration(config)
    return trackers


def find(trackers: list[Any], name: str, unwrap: bool) -> Any:
    """The started tracker called ``name`` (``unwrap``: the library's own run or writer); a blank one
    where none started (processes other than the main one).

    Raises:
        ValueError: no started tracker has that name.
    """
    if not trackers:
        return tracking.BlankTracker()
    for tracker in trackers:
        if tracker.name == name:
            return tracker.tracker if unwrap else tracker
    raise ValueError(f"no tracker {name!r} started; started: {[t.name for t in trackers]}")


def log(trackers: list[Any], values: dict[str, Any], step: int | None, log_kwargs: dict[str, Any] | None,
        main_process: bool) -> None:
    """``values`` to every tracker and, from the main process, to the notebook's live plots."""
    if main_process:
        tracking.stream_to_kernel(values, step)
    for tracker in trackers:
        tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))
