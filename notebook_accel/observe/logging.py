"""Loggers that, by default, speak only on the main process."""

from __future__ import annotations

import logging
import os
from typing import Any

from notebook_accel.runtime.state import PartialState


class MultiProcessAdapter(logging.LoggerAdapter):
    """A ``LoggerAdapter`` that logs on the main process only, unless told otherwise.

    Each logging call accepts two extra keywords: ``main_process_only`` (default
    ``True``) and ``in_order`` (log on every process, one rank after the other).
    """

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        state = self._state()
        if in_order:
            for rank in range(state.num_processes):
                if rank == state.process_index:
                    msg2, kw = self.process(msg, kwargs)
                    self.logger.log(level, msg2, *args, **kw)
                state.wait_for_everyone()
        elif not main_process_only or state.is_main_process:
            msg2, kw = self.process(msg, kwargs)
            self.logger.log(level, msg2, *args, **kw)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return msg, kwargs

    def _state(self) -> Any:
        # Read the environment once per logger and process: a logger made in the kernel
        # travels into forked workers, which have their own ranks.
        cached = self.__dict__.get("_partial_state")
        if cached is None or cached[0] != os.getpid():
            cached = self.__dict__["_partial_state"] = (os.getpid(), PartialState())
        return cached[1]


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """Return a logger for ``name`` that logs on the main process only by default.

    Args:
        name: the logger's name, usually ``__name__``.
        log_level: a level for the underlying logger; defaults to the
            ``NOTEBOOK_ACCEL_LOG_LEVEL`` environment variable, else unchanged.

    Example:
        >>> logger = get_logger(__name__, log_level="INFO")
        >>> logger.info("epoch done")                          # rank 0 only
        >>> logger.info("mine", main_process_only=False)       # every rank
    """
    logger = logging.getLogger(name)
    if log_level is None:
        log_level = os.environ.get("NOTEBOOK_ACCEL_LOG_LEVEL")
    if log_level is not None:
        logger.setLevel(log_level.upper() if isinstance(log_level, str) else log_level)
    return MultiProcessAdapter(logger, {})
