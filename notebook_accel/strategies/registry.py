"""The strategies, in the order they are asked, and the choice of one (once per ``Accelerator``).

Adding a strategy: a module (or folder) with a ``Strategy`` subclass, and one
:class:`Registration` line in ``STRATEGIES`` (what the kernel needs to know of it: the config
file's ``distributed_type`` values it runs, its section, the workers' variables from that
section, and its launch option: ``notebook_launcher(<name>=...)``, ``%%accelerate --<name>``). The
registry is torch-free; a strategy's module is imported only when a worker asks,
and must import its heavy dependencies (deepspeed, ``torch.distributed.fsdp``...) only when built.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from notebook_accel.contract import LaunchOption

if TYPE_CHECKING:  # the registry itself is torch-free: the kernel reads it before any worker starts
    from notebook_accel.strategies.base import Strategy, StrategyContext


@dataclass(frozen=True)
class Registration:
    """One strategy as the registry knows it.

    Attributes:
        strategy: ``"module:Class"`` of its :class:`Strategy`, imported only where it runs (a worker).
        distributed_types: the config file's ``distributed_type`` values it runs.
        config_section: its section of a config file (``"fsdp_config"``...), if it has one.
        environment: ``"module:function"`` turning ``(distributed_type, section)`` into the workers'
            variables, validating the section (kernel side, torch-free), if it has a section.
        option: its launch option's row (``True``: this strategy, ``False``: not even when the
            config file says so, ``None``: the file decides; ``launch/strategy_options.py``).
        plugin_environment: ``"module:function"`` turning ``(option value, the file's
            variables)`` into the workers' variables, where the option also takes a plugin.
    """

    strategy: str
    distributed_types: tuple[str, ...]
    config_section: str | None = None
    environment: str | None = None
    option: LaunchOption | None = None
    plugin_environment: str | None = None


def _attribute(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


# asked in this order; the first that wants the job runs it (ddp: always)
STRATEGIES: dict[str, Registration] = {
    "deepspeed": Registration("notebook_accel.strategies.deepspeed.strategy:DeepSpeedStrategy", ("DEEPSPEED",),
                              "deepspeed_config", "notebook_accel.strategies.deepspeed.config:strategy_environment",
                              LaunchOption("deepspeed", object, "train with DeepSpeed ZeRO (the config file's "
                                           "deepspeed_config, else its defaults)", magic_flag="--deepspeed",
                                           switch=True)),
    "fsdp": Registration("notebook_accel.strategies.fsdp.strategy:FsdpStrategy", ("FSDP",),
                         "fsdp_config", "notebook_accel.strategies.fsdp.config:strategy_environment",
                         LaunchOption("fsdp", object, "shard models with FSDP2 (the config file's fsdp_config, "
                                      "else its defaults)", magic_flag="--fsdp", switch=True),
                         "notebook_accel.strategies.fsdp.config:launch_environment"),
    "xla": Registration("notebook_accel.strategies.xla:XlaStrategy", ("XLA",)),
    "ddp": Registration("notebook_accel.strategies.ddp:DdpStrategy", ("NO", "MULTI_CPU", "MULTI_GPU")),
}


def strategy_class(name: str) -> type[Strategy]:
    """The class registered as ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    try:
        registration = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None
    return _attribute(registration.strategy)


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


def for_distributed_type(distributed_type: str) -> str:
    """The name of the strategy that runs a config file's ``distributed_type`` (``"FSDP"`` -> ``"fsdp"``).

    Raises:
        ValueError: a value no strategy runs.
    """
    for name, registration in STRATEGIES.items():
        if distributed_type in registration.distributed_types:
            return name
    raise ValueError(f"no strategy runs distributed_type {distributed_type!r}")


def launch_options() -> dict[str, LaunchOption]:
    """The strategies' launch options by name (``{"deepspeed": ..., "fsdp": ...}``)."""
    return {name: r.option for name, r in STRATEGIES.items() if r.option is not None}


def plugin_environment(name: str, plugin: Any, from_file: Mapping[str, str]) -> dict[str, str]:
    """The workers' variables for strategy ``name``'s option given a plugin (over the file's
    variables for it, ``from_file``).

    Raises:
        TypeError: the strategy's option takes no plugin (True, False or None only).
    """
    target = STRATEGIES[name].plugin_environment
    if target is None:
        raise TypeError(f"{name}={plugin!r}: pass True, False or None (a plugin goes to "
                        f"Accelerator({name}_plugin=...) inside the function)")
    return _attribute(target)(plugin, from_file)


def config_sections() -> dict[str, str]:
    """``distributed_type`` -> the config file's section of its strategy (``{"FSDP": "fsdp_config", ...}``)."""
    return {kind: r.config_section for r in STRATEGIES.values() if r.config_section
            for kind in r.distributed_types}


def worker_environment(distributed_type: str, section: Mapping[str, Any] | None) -> dict[str, str]:
    """The workers' variables for a config file's ``distributed_type`` and its strategy's section
    (validated here, kernel side, so a bad value fails before any worker starts).

    Raises:
        ValueError: a bad key or value in ``section``.
    """
    try:
        registration = STRATEGIES[for_distributed_type(distributed_type)]
    except ValueError:
        return {}
    if registration.environment is None:
        return {}
    return _attribute(registration.environment)(distributed_type, section)
