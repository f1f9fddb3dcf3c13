"""Reading the ``kwargs_handlers`` given to an ``Accelerator`` (ours or the peer's, found by class name)."""

from __future__ import annotations

from typing import Any


def find_handler(handlers: list[Any] | None, class_name: str) -> Any:
    """The kwargs handler (ours or the peer's) of that class name, or None."""
    return next((h for h in handlers or [] if type(h).__name__ == class_name), None)


def handler_kwargs(handlers: list[Any] | None, class_name: str) -> dict[str, Any]:
    """Keyword arguments from a kwargs handler (ours or the peer's) of that class name."""
    handler = find_handler(handlers, class_name)
    if handler is None:
        return {}
    return handler.to_kwargs() if hasattr(handler, "to_kwargs") else dict(vars(handler))


def process_group_kwargs(handlers: list[Any] | None) -> dict[str, Any]:
    """``AcceleratorState``'s process-group arguments from an ``InitProcessGroupKwargs`` (ours or the
    peer's): its timeout, init method, and backend unless it is the default ``"nccl"`` (the device's own)."""
    kwargs = handler_kwargs(handlers, "InitProcessGroupKwargs")
    if kwargs.get("backend") == "nccl":
        del kwargs["backend"]
    return {k: v for k, v in kwargs.items() if k in ("backend", "init_method", "timeout")}


def comm_hook(handlers: list[Any] | None) -> tuple[str, str, dict]:
    """DDP's communication hook from a ``DistributedDataParallelKwargs``: ``(hook, wrapper, options)``."""
    handler = find_handler(handlers, "DistributedDataParallelKwargs")

    def name(value: Any) -> str:
        return str(getattr(value, "value", value))

    return (name(getattr(handler, "comm_hook", "no")), name(getattr(handler, "comm_wrapper", "no")),
            dict(getattr(handler, "comm_state_option", None) or {}))
