"""A config file's ``fsdp_config:`` (the peer's keys) as the workers' environment.

The launcher turns ``distributed_type: FSDP`` plus ``fsdp_config`` into
``ACCELERATE_USE_FSDP=true`` and the peer's ``FSDP_*`` variables; ``Accelerator()``
in each worker then builds its ``FullyShardedDataParallelPlugin`` from them, exactly
as it would under ``accelerate launch`` or a ``torchrun`` given those variables.
The values are validated here, in the kernel, before any worker starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from notebook_accel.strategies.fsdp.plugin import USE_FSDP, FullyShardedDataParallelPlugin

CONFIG_KEYS = {  # fsdp_config key -> plugin field
    "fsdp_version": "fsdp_version",
    "fsdp_reshard_after_forward": "reshard_after_forward",
    "fsdp_auto_wrap_policy": "auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
    "fsdp_min_num_params": "min_num_params",
    "fsdp_state_dict_type": "state_dict_type",
    "fsdp_offload_params": "cpu_offload",
    "fsdp_cpu_ram_efficient_loading": "cpu_ram_efficient_loading",
    "fsdp_activation_checkpointing": "activation_checkpointing",
    "fsdp_activation_checkpointing_offload": "activation_checkpointing_offload",
    "fsdp_ignored_modules": "ignored_modules",
    "fsdp_forward_prefetch": "forward_prefetch",
    "fsdp_sharding_strategy": "sharding_strategy",  # FSDP1: mapped to reshard_after_forward, with a warning
    "fsdp_backward_prefetch": "backward_prefetch",  # FSDP1 only: warns
    "fsdp_use_orig_params": "use_orig_params",  # FSDP1 only: warns
    "fsdp_sync_module_states": "sync_module_states",  # FSDP1 only: warns
}


def plugin_from_config(fsdp_config: Mapping[str, Any] | None) -> FullyShardedDataParallelPlugin:
    """The plugin ``fsdp_config`` describes (validated; FSDP1 keys warn).

    Raises:
        ValueError: an unknown key (the valid ones are listed) or a bad value.
    """
    fsdp_config = dict(fsdp_config or {})
    unknown = sorted(set(fsdp_config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"unknown fsdp_config key(s) {unknown}; valid keys: {sorted(CONFIG_KEYS)}")
    fields = {CONFIG_KEYS[k]: v for k, v in fsdp_config.items() if v is not None}
    if fields.get("backward_prefetch") in ("NO_PREFETCH", False):  # the peer's "nothing" for this key
        del fields["backward_prefetch"]
    return FullyShardedDataParallelPlugin(**fields)


def plugin_environment(plugin: FullyShardedDataParallelPlugin) -> dict[str, str]:
    """The variables from which a worker's ``Accelerator()`` rebuilds ``plugin``."""
    env = {
        USE_FSDP: "true",
        "FSDP_VERSION": "2",
        "FSDP_RESHARD_AFTER_FORWARD": str(plugin.reshard_after_forward).lower(),
        "FSDP_STATE_DICT_TYPE": str(plugin.state_dict_type),
        "FSDP_OFFLOAD_PARAMS": str(plugin.cpu_offload).lower(),
        "FSDP_CPU_RAM_EFFICIENT_LOADING": str(plugin.cpu_ram_efficient_loading).lower(),
        "FSDP_ACTIVATION_CHECKPOINTING": str(plugin.activation_checkpointing).lower(),
        "FSDP_MIN_NUM_PARAMS": str(plugin.min_num_params),
    }
    if isinstance(plugin.auto_wrap_policy, str):
        env["FSDP_AUTO_WRAP_POLICY"] = plugin.auto_wrap_policy
    if plugin.transformer_cls_names_to_wrap:
        env["FSDP_TRANSFORMER_CLS_TO_WRAP"] = ",".join(plugin.transformer_cls_names_to_wrap)
    if isinstance(plugin.ignored_modules, str):
        env["FSDP_IGNORED_MODULES"] = plugin.ignored_modules
    return env


def strategy_environment(distributed_type: str, fsdp_config: Mapping[str, Any] | None) -> dict[str, str]:
    """The workers' extra variables for a config file's ``distributed_type`` (``{}`` unless FSDP).

    Raises:
        ValueError: see :func:`plugin_from_config`.
    """
    if distributed_type != "FSDP":
        return {}
    return plugin_environment(plugin_from_config(fsdp_config))


def launch_environment(fsdp: Any, from_file: Mapping[str, str]) -> dict[str, str]:
    """``notebook_launcher(fsdp=...)`` over the config file's variables ``from_file``.

    ``None``: the file decides; ``False``: no FSDP; ``True``: FSDP with the file's
    ``fsdp_config`` if it has one, else the defaults; a plugin (ours or the peer's): exactly it.

    Raises:
        ValueError: a plugin setting that cannot travel as a variable (a callable wrap policy,
            module objects in ``ignored_modules``, a ``MixedPrecisionPolicy``): give such a
            plugin to ``Accelerator(fsdp_plugin=...)`` inside the function instead.
        TypeError: ``fsdp`` of another type.
    """
    others = {k: v for k, v in from_file.items() if k != USE_FSDP and not k.startswith("FSDP_")}
    if fsdp is None:
        return dict(from_file)
    if fsdp is False:
        return others
    if fsdp is True:
        return dict(from_file) if USE_FSDP in from_file else {**others, **plugin_environment(
            FullyShardedDataParallelPlugin())}
    if type(fsdp).__name__ != "FullyShardedDataParallelPlugin":
        raise TypeError(f"fsdp={fsdp!r}: pass True, False, None or a FullyShardedDataParallelPlugin")
    from notebook_accel.strategies.fsdp.plugin import resolve_plugin

    plugin = resolve_plugin(fsdp)
    local = [name for name, bad in (
        ("auto_wrap_policy", callable(plugin.auto_wrap_policy)),
        ("ignored_modules", plugin.ignored_modules is not None and not isinstance(plugin.ignored_modules, str)),
        ("mixed_precision_policy", plugin.mixed_precision_policy is not None)) if bad]
    if local:
        raise ValueError(f"the plugin's {local} cannot be sent to the workers; create the plugin inside the "
                         "function and pass it to Accelerator(fsdp_plugin=...), or use a config file's fsdp_config")
    return {**others, **plugin_environment(plugin)}
