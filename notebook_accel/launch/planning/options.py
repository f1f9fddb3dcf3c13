"""Fill in the launch options the caller left unset: environment, then the config file, then
the table's defaults; and the training strategy the workers run.

Precedence (docs/architecture.md, One vocabulary): explicit argument > environment (``NOTEBOOK_ACCEL_*``) >
config file > built-in defaults and auto-detection.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from notebook_accel.config import LaunchConfig, dynamo, load_config
from notebook_accel.config.resolve import layered_options
from notebook_accel.config.schema import STRATEGY_SECTIONS
from notebook_accel.contract import LaunchOption
from notebook_accel.launch.planning.request import launch_options
from notebook_accel.strategies import registry
from notebook_accel.strategies.registry import STRATEGIES


def fill_options(explicit: Mapping[str, Any], config_file: str | os.PathLike | None,
                 notes: list[str] | None = None) -> dict[str, Any]:
    """Every launch option's value: ``explicit``'s (a :class:`~notebook_accel.launch.planning.request.
    LaunchRequest`, or a dict whose None is "not given"), else the environment's, the config
    file's, the table's default.

    The result also has ``worker_env``: the workers' variables for the training strategy (the
    strategy options, ``fsdp=True``..., else the file's: :func:`strategy_environment`) and the
    file's ``dynamo_config`` (``config.dynamo.section_environment``). Explicit values pass
    through untouched (the request checked them); values that come from the environment or the
    config file are checked there, with their source in the error.

    Args:
        notes: when given, gets a line naming the config file in force and what it
            set, when a file set anything (a saved config applies to every launch).
    """
    options = {name: o for name, o in launch_options().items() if o.argument}
    given = {name for name, value in explicit.items()
             if value is not None or (name in options and options[name].nullable)}
    config = load_config(config_file)
    layered = layered_options(config, given)  # a file's bad value the caller overrides: no error
    blank = LaunchConfig()  # what a file that sets nothing holds (read, not checked again)
    chosen = {name: explicit.get(name) for name in registry.launch_options()}
    filled: dict[str, Any] = {"worker_env": {**strategy_environment(config, chosen),
                                             **dynamo.section_environment(config.extra.get(dynamo.SECTION))}}
    from_file: dict[str, Any] = {}
    for key, option in options.items():
        value = explicit[key] if key in given else layered.get(key)
        if (key not in given and value is not None and not _in_environment(option)
                and value != _file_value(blank, key)):
            from_file[key] = value
        filled[key] = option.default if value is None and key not in given else value
    if notes is not None and config is not None and config.source is not None and from_file:
        settings = ", ".join(f"{key}={value!r}" for key, value in from_file.items())
        notes.append(f"config file {config.source}: {settings}")
    return filled


def _in_environment(option: LaunchOption) -> bool:
    """Whether ``option``'s variable is set (its value, read and checked, won over the file's)."""
    return bool(option.env and os.environ.get(option.env, "").strip())


def _file_value(config: LaunchConfig, key: str) -> Any:
    """``config``'s raw value for the launch option ``key`` (None: it holds none)."""
    if key in ("device", "gpu_ids"):
        return config.device_type if key == "device" else config.gpu_ids
    file_key = launch_options()[key].file_key
    return getattr(config, file_key, None) if file_key else None


def strategy_environment(config: LaunchConfig, chosen: Mapping[str, Any]) -> dict[str, str]:
    """The workers' variables for the training strategy: the file's, unless a strategy option
    (``chosen``: name -> ``True``, ``False``, a plugin, or None: not given) says otherwise.

    ``True``: that strategy, with the file's section when the file names it, else its defaults;
    a plugin: that strategy, through its registration's ``plugin_environment``; ``False``: not
    that strategy, even when the file names it.

    Raises:
        ValueError: two strategies asked for; a bad value in the file's section.
        TypeError: a value the strategy's option does not take.
    """
    from_file = worker_strategy_environment(config)
    try:
        in_file = registry.for_distributed_type(config.distributed_type)
    except ValueError:  # a peer's type we do not run (reported when the file is read)
        in_file = None
    asked = {name: value for name, value in chosen.items() if value not in (None, False)}
    if len(asked) > 1:
        raise ValueError(f"{' and '.join(f'{name}={value!r}' for name, value in asked.items())}: "
                         "choose one strategy")
    if not asked:
        return {} if chosen.get(in_file) is False else from_file
    [(name, value)] = asked.items()
    own = from_file if name == in_file else {}
    if value is True:
        return own or registry.worker_environment(STRATEGIES[name].distributed_types[0], None)
    return registry.plugin_environment(name, value, own)
def worker_strategy_environment(config: LaunchConfig) -> dict[str, str]:
    """The workers' variables for the file's training strategy (``distributed_type: FSDP`` plus
    ``fsdp_config``, or ``DEEPSPEED`` plus ``deepspeed_config``); validated here, so a bad value
    fails before any worker starts.

    Raises:
        ValueError: a bad ``fsdp_config`` / ``deepspeed_config`` key or value, naming the file.
    """
    key = STRATEGY_SECTIONS.get(config.distributed_type)
    if key is None:
        return {}
    try:
        return registry.worker_environment(config.distributed_type, config.extra.get(key))
    except ValueError as err:
        raise ValueError(f"{config.source or 'launch config'}: {key}: {err}") from None
