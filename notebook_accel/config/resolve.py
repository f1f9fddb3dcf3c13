"""The launcher's view of the config: precedence of explicit options, environment and file."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from notebook_accel.config.schema import (
    MIXED_PRECISIONS,
    START_METHODS,
    KeyValueError,
    LaunchConfig,
    check_int,
    choice,
)

ENV_OPTIONS = {  # launch option -> environment variable (between explicit and the file)
    "num_processes": "NOTEBOOK_ACCEL_NUM_PROCESSES",
    "mixed_precision": "NOTEBOOK_ACCEL_MIXED_PRECISION",
    "start_method": "NOTEBOOK_ACCEL_START_METHOD",
}


def detect_default_config() -> LaunchConfig:
    """A config for this machine's hardware (found without initialising CUDA).

    GPUs: one process per GPU on ``cuda``; TPU: ``xla``; otherwise ``cpu``. On TPU
    and CPU ``num_processes`` stays unset, so the launcher picks it.
    """
    from notebook_accel.hardware import detect

    hw = detect()
    if hw.tpu:
        return LaunchConfig().with_device("xla")
    if hw.gpu_count:
        return LaunchConfig(num_processes=hw.gpu_count).with_device("cuda")
    return LaunchConfig().with_device("cpu")


_FROM_FILE = {  # launch option -> LaunchConfig field
    "num_processes": "num_processes", "mixed_precision": "mixed_precision",
    "start_method": "start_method", "use_port": "main_process_port",
    "master_addr": "main_process_ip", "num_nodes": "num_machines", "node_rank": "machine_rank",
}
_CHECK: dict[str, Callable[[Any], Any]] = {  # validate and normalise an explicit value
    "num_processes": lambda v: check_int("num_processes", v, 1),
    "mixed_precision": lambda v: choice("mixed_precision", v, MIXED_PRECISIONS, str.lower),
    "start_method": lambda v: choice("start_method", v, START_METHODS, str.lower),
    "use_port": lambda v: check_int("use_port", v, 1, 65535),
    "master_addr": lambda v: v if isinstance(v, str) and v else _bad_addr(v),
    "num_nodes": lambda v: check_int("num_nodes", v, 1),
    "node_rank": lambda v: check_int("node_rank", v, 0),
}


def _bad_addr(value: Any) -> None:
    raise KeyValueError("master_addr", f"invalid value {value!r} for 'master_addr'; "
                                       "valid values: a host name or IP address")


def _from_env(option: str) -> Any:
    var = ENV_OPTIONS[option]
    raw = os.environ.get(var, "").strip()
    if not raw:
        return None
    try:
        return _CHECK[option](int(raw) if raw.isdigit() else raw)
    except KeyValueError as err:
        raise ValueError(f"environment variable {var}: {err}") from None


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
        ValueError: an unknown option, or a bad value in ``explicit`` or in a
            ``NOTEBOOK_ACCEL_*`` variable.

    Example::

        opts = resolve_launch_options({"num_processes": 2}, load_config())
    """
    unknown = sorted(set(explicit) - set(_FROM_FILE))
    if unknown:
        raise ValueError(f"unknown launch option(s) {unknown}; valid: {list(_FROM_FILE)}")
    out: dict[str, Any] = {}
    for key, field_name in _FROM_FILE.items():
        value = explicit.get(key)
        if value is not None:
            out[key] = _CHECK[key](value)
        elif key in ENV_OPTIONS and _from_env(key) is not None:
            out[key] = _from_env(key)
        else:
            out[key] = getattr(config, field_name) if config is not None else None
    out["device"] = config.device_type if config is not None else None
    out["gpu_ids"] = config.gpu_ids if config is not None else None
    return out
