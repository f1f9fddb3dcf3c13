"""The strategies, in the order they are asked, and the choice of one (once per ``Accelerator``).

Adding a strategy: a module (or folder) with a ``Strategy`` subclass, and one line in
``STRATEGIES``. Its module is imported when the registry is asked, so it must import its
heavy dependencies (deepspeed, ``torch.distributed.fsdp``...) only when it is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from notebook_accel.strategies.base import Strategy, StrategyContext

# name -> "module:class"; asked in this order, the first that wants the job runs it (ddp: always)
STRATEGIES: dict[str, str] = {
    "deepspeed": "notebook_accel.strategies.deepspeed.strategy:DeepSpeedStrategy",
    "fsdp": "notebook_accel.strategies.fsdp.strategy:FsdpStrategy",
    "xla": "notebook_accel.strategies.xla:XlaStrategy",
    "ddp": "notebook_accel.strategies.ddp:DdpStrategy",
}


def strategy_class(name: str) -> type[Strategy]:
    """The class registered as ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    try:
        module, _, attribute = STRATEGIES[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None
    return getattr(importlib.import_module(module), attribute)


def select(context: StrategyContext, plugins: Mapping[str, Any] | None = None) -> tuple[Strategy, dict[str, Any]]:
    """The strategy for this job, built, and every strategy's resolved plugin (``None`` where not asked for).

    Args:
        context: the worker and its Accelerator.
        plugins: plugins given by the user, by strategy name (``{"fsdp": ..., "deepspeed": ...}``);
            a missing or ``None`` one comes from the environment (``ACCELERATE_USE_FSDP``...).

    Raises:
        ValueError: plugins for more than one strategy; a strategy that cannot run this job.
    """
    plugins = plugins or {}
    classes = [strategy_class(name) for name in STRATEGIES]
    resolved = {cls.name: cls.resolve_plugin(plugins.get(cls.name)) for cls in classes}
    asked = [name for name, plugin in resolved.items() if plugin is not None]
    if len(asked) > 1:
        raise ValueError(f"plugins for {' and '.join(asked)} were given (or their ACCELERATE_USE_* variables "
                         "are both set); choose one strategy")
    chosen = next(cls for cls in classes if cls.wanted(context, resolved[cls.name]))
    return chosen(context, resolved[chosen.name]), resolved


def for_distributed_type(distributed_type: str) -> type[Strategy]:
    """The strategy that runs a config file's ``distributed_type`` (``"FSDP"`` -> FSDP's...).

    Raises:
        ValueError: a value no strategy runs.
    """
    for name in STRATEGIES:
        cls = strategy_class(name)
        if distributed_type in cls.distributed_types:
            return cls
    raise ValueError(f"no strategy runs distributed_type {distributed_type!r}")


def config_sections() -> dict[str, str]:
    """``distributed_type`` -> the config file's section of its strategy (``{"FSDP": "fsdp_config", ...}``)."""
    sections = {}
    for name in STRATEGIES:
        cls = strategy_class(name)
        if cls.config_section is not None:
            sections.update(dict.fromkeys(cls.distributed_types, cls.config_section))
    return sections


def worker_environment(distributed_type: str, section: Mapping[str, Any] | None) -> dict[str, str]:
    """The workers' variables for a config file's ``distributed_type`` and its strategy's section
    (validated here, kernel side, so a bad value fails before any worker starts).

    Raises:
        ValueError: a bad key or value in ``section``.
    """
    try:
        cls = for_distributed_type(distributed_type)
    except ValueError:
        return {}
    return cls.worker_environment(section)
