"""A config file's ``deepspeed_config:`` (the peer's keys) as the workers' environment.

The launcher turns ``distributed_type: DEEPSPEED`` plus ``deepspeed_config`` into
``ACCELERATE_USE_DEEPSPEED=true`` and the peer's ``ACCELERATE_DEEPSPEED_*`` variables;
``Accelerator()`` in each worker then builds its ``DeepSpeedPlugin`` from them, exactly as
under ``accelerate launch`` or a ``torchrun`` given those variables. The values are
validated here, in the kernel, before any worker starts (deepspeed is not imported).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from notebook_accel.strategies.deepspeed.plugin import ENV, USE_DEEPSPEED, DeepSpeedPlugin

CONFIG_KEYS = {  # deepspeed_config key -> plugin field
    "zero_stage": "zero_stage",
    "offload_optimizer_device": "offload_optimizer_device",
    "offload_param_device": "offload_param_device",
    "offload_optimizer_nvme_path": "offload_optimizer_nvme_path",
    "offload_param_nvme_path": "offload_param_nvme_path",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero3_init_flag": "zero3_init_flag",
    "zero3_save_16bit_model": "zero3_save_16bit_model",
    "deepspeed_config_file": "hf_ds_config",
}
MULTI_NODE_KEYS = ("deepspeed_multinode_launcher", "deepspeed_hostfile", "deepspeed_exclusion_filter",
                   "deepspeed_inclusion_filter")  # one machine here: accepted, warned about
OTHER_KEYS = ("deepspeed_moe_layer_cls_names",)


def plugin_from_config(deepspeed_config: Mapping[str, Any] | None) -> DeepSpeedPlugin:
    """The plugin ``deepspeed_config`` describes (validated).

    Raises:
        ValueError: an unknown key (the valid ones are listed) or a bad value.
    """
    deepspeed_config = dict(deepspeed_config or {})
    valid = sorted({*CONFIG_KEYS, *MULTI_NODE_KEYS, *OTHER_KEYS})
    unknown = sorted(set(deepspeed_config) - set(valid))
    if unknown:
        raise ValueError(f"unknown deepspeed_config key(s) {unknown}; valid keys: {valid}")
    multi = sorted(k for k in MULTI_NODE_KEYS if deepspeed_config.get(k) not in (None, "", "none"))
    if multi:
        warnings.warn(f"deepspeed_config {multi}: multi-machine DeepSpeed launching is not used here "
                      "(workers start on this machine)", stacklevel=3)
    fields = {CONFIG_KEYS[k]: v for k, v in deepspeed_config.items() if k in CONFIG_KEYS and v is not None}
    if isinstance(fields.get("hf_ds_config"), str):
        fields["hf_ds_config"] = str(Path(fields["hf_ds_config"]).expanduser().absolute())
    if deepspeed_config.get("deepspeed_moe_layer_cls_names"):
        fields["transformer_moe_cls_names"] = deepspeed_config["deepspeed_moe_layer_cls_names"]
    return DeepSpeedPlugin(**fields)


def strategy_environment(distributed_type: str, deepspeed_config: Mapping[str, Any] | None) -> dict[str, str]:
    """The workers' extra variables for ``distributed_type: DEEPSPEED`` (``{}`` otherwise): one per
    key the file sets (a ``deepspeed_config_file`` as an absolute path), as the peer's launcher sends them.

    Raises:
        ValueError: see :func:`plugin_from_config`.
    """
    if distributed_type != "DEEPSPEED":
        return {}
    plugin = plugin_from_config(deepspeed_config)  # validates
    env = {USE_DEEPSPEED: "true"}
    for key, value in (deepspeed_config or {}).items():
        field = CONFIG_KEYS.get(key)
        if field is not None and value is not None:
            value = plugin.hf_ds_config if field == "hf_ds_config" else value
            env[ENV[field]] = str(value).lower() if isinstance(value, bool) else str(value)
    return env
