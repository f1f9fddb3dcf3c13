"""Fill in the launch options the caller left unset: environment, then the config file.

Precedence (DESIGN.md): explicit argument > environment (``NOTEBOOK_ACCEL_*``) >
config file > built-in defaults and auto-detection.
"""

from __future__ import annotations

import os
from typing import Any

from notebook_accel import contract
from notebook_accel.config import LaunchConfig, dynamo, load_config
from notebook_accel.config.resolve import layered_options
from notebook_accel.config.schema import STRATEGY_SECTIONS
from notebook_accel.strategies import registry

DEFAULTS = {k: v for k, v in contract.DEFAULTS.items() if k in contract.LAYERED}


def fill_options(explicit: dict[str, Any], config_file: str | os.PathLike | None,
                 notes: list[str] | None = None) -> dict[str, Any]:
    """Return ``explicit`` with its None values filled from the layers below it.

    ``explicit`` holds ``num_processes``, ``mixed_precision``, ``start_method``,
    ``use_port``, ``master_addr``, ``num_nodes``, ``node_rank`` and ``device``; the result also
    has ``worker_env``, the file's strategy variables (see ``worker_strategy_environment``) and
    its ``dynamo_config`` variables (``config.dynamo.section_environment``).
    Explicit values pass through untouched (the plan validates them); values that
    come from the config file are checked there, with the file's name in the error.

    Args:
        notes: when given, gets a line naming the config file in force and what it
            set, when a file set anything (a saved config applies to every launch).
    """
    config = load_config(config_file)
    given = [key for key, value in explicit.items() if value is not None]
    layered = layered_options(config, given)  # a file's bad value the caller overrides: no error
    blank = layered_options(LaunchConfig(), given)  # what a file that sets nothing gives
    filled: dict[str, Any] = {"worker_env": {**worker_strategy_environment(config),
                                             **dynamo.section_environment(config.extra.get(dynamo.SECTION))}}
    from_file: dict[str, Any] = {}
    for key, value in explicit.items():
        if value is None:
            value = layered.get(key)
            if value is not None and value != blank.get(key):  # (the environment is in both)
                from_file[key] = value
        if value is None:
            value = DEFAULTS.get(key)
        filled[key] = value
    if notes is not None and config is not None and config.source is not None and from_file:
        settings = ", ".join(f"{key}={value!r}" for key, value in from_file.items())
        notes.append(f"config file {config.source}: {settings}")
    return filled


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
