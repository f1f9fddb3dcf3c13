"""The launcher's view of the config: precedence of explicit options, environment and file."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any

from notebook_accel.config.files import where_in_file
from notebook_accel.config.schema import LaunchConfig
from notebook_accel.contract import ENV_OPTIONS, OPTIONS, layered

__all__ = ["ENV_OPTIONS", "detect_default_config", "device_to_save", "layered_options",
           "resolve_launch_options"]


def detect_default_config() -> LaunchConfig:
    """A config for this machine's hardware (found without initialising CUDA).

    The device a launch's auto picks (:func:`~notebook_accel.machine.devices.auto_device`): on
    ``cuda`` one process per GPU; on ``xla`` and ``cpu`` ``num_processes`` stays unset, so the
    launcher picks it.
    """
    from notebook_accel.machine.devices import auto_device
    from notebook_accel.machine.hardware import detect

    hw = detect()
    device = auto_device(hw)
    return LaunchConfig(num_processes=hw.gpu_count if device == "cuda" else None).with_device(device)


def device_to_save(device: str | None, config: LaunchConfig, hw: Any = None) -> str | None:
    """The device a saved file names for ``device`` (None: auto) in ``config``.

    With several processes (or machines) auto is written as what the launcher's auto picks
    on ``hw`` (:func:`~notebook_accel.machine.devices.auto_device`; ``hw`` defaults to this
    machine's :func:`~notebook_accel.machine.hardware.detect`): the peer's format has no "auto"
    there, and its ``accelerate launch`` would run one process (:meth:`LaunchConfig.with_device`).
    """
    if device is not None or ((config.num_processes or 1) <= 1 and config.num_machines <= 1):
        return device
    from notebook_accel.machine.devices import auto_device

    if hw is None:
        from notebook_accel.machine.hardware import detect

        hw = detect()
    return auto_device(hw)


def _from_env(option: str) -> Any:
    var = OPTIONS[option].env
    raw = os.environ.get(var, "").strip() if var else ""
    if not raw:
        return None
    return OPTIONS[option].check(int(raw) if raw.isdigit() else raw, f"environment variable {var}")


def _from_file(option: str, config: LaunchConfig) -> Any:
    """The file's value for ``option``, checked as a launch value (the file may hold what the
    peer accepts, such as ``mixed_precision: fp8``; a launch refuses it, naming the file)."""
    key = OPTIONS[option].file_key
    value = getattr(config, key) if key else None
    if value is None:
        return None
    source = where_in_file(config.source, key) if config.source is not None else "launch config"
    return OPTIONS[option].check(value, source, key)


def resolve_launch_options(explicit: Mapping[str, Any], config: LaunchConfig | None) -> dict:
    """Apply the precedence explicit argument > environment > config file.

    Args:
        explicit: the options the user actually passed (None: not passed), among
            ``num_processes``, ``mixed_precision``, ``start_method``, ``use_port``,
            ``master_addr``, ``num_nodes``, ``node_rank``.
        config: the loaded config file, or None to skip that layer.
    Returns:
        All those keys plus ``device`` (``"cpu"``/``"cuda"``/``"xla"``) and
        ``gpu_ids`` (from the file only); what no layer sets is None, for the
        launcher to auto-detect.
    Raises:
        ValueError: an unknown option, or a bad value in ``explicit``, in a
            ``NOTEBOOK_ACCEL_*`` variable or in the file (one a launch refuses, such as
            ``mixed_precision: fp8``), naming where it came from and the valid values.

    Example::

        opts = resolve_launch_options({"num_processes": 2}, load_config())
    """
    names = [option.name for option in layered()]
    unknown = sorted(set(explicit) - set(names))
    if unknown:
        raise ValueError(f"unknown launch option(s) {unknown}; valid: {names}")
    given = {key: OPTIONS[key].check(value) for key, value in explicit.items() if value is not None}
    return {**layered_options(config, given=given), **given}


def layered_options(config: LaunchConfig | None, given: Collection[str] = ()) -> dict[str, Any]:
    """The environment's and the file's values (environment first) for the options not in
    ``given`` (those the caller has; None here, and never read, so a bad value the
    caller overrides is no error), plus ``device`` and ``gpu_ids`` (from the file).

    Raises:
        ValueError: a bad value in a ``NOTEBOOK_ACCEL_*`` variable or in the file, naming it.
    """
    out: dict[str, Any] = {}
    for key in (option.name for option in layered()):
        if key in given:
            out[key] = None
        elif (from_env := _from_env(key)) is not None:  # read and checked once
            out[key] = from_env
        else:
            out[key] = _from_file(key, config) if config is not None else None
    out["device"] = config.device_type if config is not None else None
    out["gpu_ids"] = config.gpu_ids if config is not None else None
    return out
