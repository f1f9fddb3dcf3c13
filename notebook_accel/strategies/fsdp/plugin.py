"""``FullyShardedDataParallelPlugin``: the peer's FSDP settings, validated, for torch's FSDP2.

Fields and environment variables have the peer's names (``FSDP_VERSION``,
``FSDP_OFFLOAD_PARAMS``, ...; ``ACCELERATE_USE_FSDP=true`` turns FSDP on), so a
config file, ``accelerate launch`` or a plain ``torchrun`` with those variables all
reach the same plugin. A field left ``None`` is read from its variable.

Only FSDP2 (``torch.distributed.fsdp.fully_shard``) is implemented. FSDP1-only
settings (``sharding_strategy``, ``backward_prefetch``, ``use_orig_params``,
``sync_module_states``, ``limit_all_gathers``, ``fsdp_version=1``) warn and are
mapped or dropped; those the peer refuses under FSDP2 (``forward_prefetch``,
``LOCAL_STATE_DICT``, a non-bool ``reshard_after_forward``) are refused.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from notebook_accel.flags import to_bool

USE_FSDP = "ACCELERATE_USE_FSDP"
AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
# torch's FSDP1 policy functions, given bare (the peer's plugin holds them so before set_auto_wrap_policy)
_TORCH_POLICY_NAMES = {"transformer_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                       "size_based_auto_wrap_policy": "SIZE_BASED_WRAP"}
STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
_RESHARD_OF_STRATEGY = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}
FSDP1_ONLY_FIELDS = ("backward_prefetch", "use_orig_params", "sync_module_states", "limit_all_gathers",
                     "param_init_fn", "state_dict_config", "optim_state_dict_config")


def _env(name: str) -> str | None:
    value = os.environ.get(f"FSDP_{name}")
    return None if value is None or value.lower() in ("none", "null") else value


def fsdp_requested() -> bool:
    """Whether the environment asks for FSDP (``ACCELERATE_USE_FSDP``, set by the launcher)."""
    return to_bool(USE_FSDP, os.environ.get(USE_FSDP, "false"))


@dataclass
class FullyShardedDataParallelPlugin:
    """How ``prepare`` shards models with FSDP2 (the peer's field names).

    Args:
        fsdp_version: 2 (default); 1 is accepted with a warning and runs FSDP2.
        reshard_after_forward: free the gathered parameters after forward (ZeRO-3, default)
            or keep them until backward (ZeRO-2).
        auto_wrap_policy: ``"TRANSFORMER_BASED_WRAP"`` (the classes in
            ``transformer_cls_names_to_wrap``), ``"SIZE_BASED_WRAP"`` (modules with at least
            ``min_num_params`` parameters), ``"NO_WRAP"`` (one group for the whole model), a
            callable ``policy(module) -> bool``, or one of torch's FSDP1 policies (e.g.
            ``functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={GPT2Block})``).
            Without ``transformer_cls_names_to_wrap``, ``TRANSFORMER_BASED_WRAP`` wraps the model's
            own ``_no_split_modules`` (a transformers model's decoder layer class).
        mixed_precision_policy: a ``torch.distributed.fsdp.MixedPrecisionPolicy``; default: from
            the Accelerator's ``mixed_precision`` (low-precision compute, fp32 master weights,
            fp32 gradient reduction).
        cpu_offload: keep the parameter shards, gradients and optimizer state in CPU memory.
        ignored_modules: modules (or a regex full-matched against module names) left unsharded.
        state_dict_type: ``"SHARDED_STATE_DICT"`` (default: ``save_state`` writes one file per
            rank) or ``"FULL_STATE_DICT"`` (gathered to rank 0).
        activation_checkpointing: recompute the wrapped layers' activations in backward.
        cpu_ram_efficient_loading: only rank 0's weights are used; other ranks may build the
            model on the meta device and receive the weights in ``prepare``.
        transformer_cls_names_to_wrap, min_num_params: see ``auto_wrap_policy``.
        sharding_strategy, backward_prefetch, use_orig_params, sync_module_states,
        limit_all_gathers, forward_prefetch, param_init_fn, state_dict_config,
        optim_state_dict_config, activation_checkpointing_offload: the peer's FSDP1
            fields; accepted for compatibility as described in the module docstring.

    Raises:
        ValueError: a value outside its choices (the message names the field and the choices).

    Example:
        >>> plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP",
        ...                                         transformer_cls_names_to_wrap=["Block"])
    """

    fsdp_version: int | None = None
    sharding_strategy: str | None = None
    reshard_after_forward: bool | str | None = None
    backward_prefetch: str | None = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: str | Callable[[Any], bool] | None = None
    cpu_offload: bool | str | None = None
    ignored_modules: Iterable[Any] | str | None = None
    state_dict_type: str | None = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool | None = None
    use_orig_params: bool | None = None
    param_init_fn: Callable[[Any], None] | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | str | None = None
    activation_checkpointing_offload: bool | str | None = None
    cpu_ram_efficient_loading: bool | str | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | str | None = None

    def __post_init__(self) -> None:
        v1_notes: list[str] = []
        self._check_version(v1_notes)
        self._check_resharding(v1_notes)
        for name in FSDP1_ONLY_FIELDS:  # the peer's launcher always exports some: only explicit ones warn
            if getattr(self, name) is not None:
                v1_notes.append(f"{name} is an FSDP1 setting; FSDP2 does not use it")
                setattr(self, name, None)
        forward_prefetch = self.forward_prefetch if self.forward_prefetch is not None else _env("FORWARD_PREFETCH")
        if forward_prefetch is not None and to_bool("forward_prefetch", forward_prefetch):
            raise ValueError("forward_prefetch=True is not available in FSDP2; set it to false or leave it unset")
        self.forward_prefetch = None
        self.cpu_offload = self._bool("cpu_offload", "OFFLOAD_PARAMS")
        self.activation_checkpointing = self._bool("activation_checkpointing", "ACTIVATION_CHECKPOINTING")
        self.activation_checkpointing_offload = self._bool(
            "activation_checkpointing_offload", "ACTIVATION_CHECKPOINTING_OFFLOAD")
        if self.activation_checkpointing_offload:
            raise ValueError("activation_checkpointing_offload=True is not supported; set it to false")
        self.cpu_ram_efficient_loading = self._bool("cpu_ram_efficient_loading", "CPU_RAM_EFFICIENT_LOADING")
        self._check_state_dict_type()
        self._check_wrap_policy()
        if self.activation_checkpointing and self.auto_wrap_policy == "NO_WRAP":
            raise ValueError("activation_checkpointing needs auto_wrap_policy TRANSFORMER_BASED_WRAP or "
                             "SIZE_BASED_WRAP (or a callable), to choose which layers to recompute; got NO_WRAP")
        if self.ignored_modules is None:
            self.ignored_modules = _env("IGNORED_MODULES")
        if v1_notes:
            warnings.warn("FSDP2 (fully_shard) is used: " + "; ".join(v1_notes), stacklevel=3)

    def _bool(self, field_name: str, env_name: str) -> bool:
        value = getattr(self, field_name)
        return to_bool(field_name, value if value is not None else (_env(env_name) or "false"))

    def _check_version(self, notes: list[str]) -> None:
        raw = self.fsdp_version if self.fsdp_version is not None else (_env("VERSION") or "2")
        if str(raw) not in ("1", "2"):
            raise ValueError(f"invalid fsdp_version {raw!r}; valid values: 1, 2")
        if str(raw) == "1":
            notes.append("fsdp_version 1 is not implemented, FSDP2 runs instead")
        self.fsdp_version = 2

    def _check_resharding(self, notes: list[str]) -> None:
        strategy = self.sharding_strategy if self.sharding_strategy is not None else _env("SHARDING_STRATEGY")
        reshard = self.reshard_after_forward if self.reshard_after_forward is not None else _env(
            "RESHARD_AFTER_FORWARD")
        if strategy is not None:
            name = str(strategy).upper()
            if name.isdigit() and 1 <= int(name) <= len(SHARDING_STRATEGIES):
                name = SHARDING_STRATEGIES[int(name) - 1]
            if name not in _RESHARD_OF_STRATEGY:
                raise ValueError(
                    f"sharding_strategy {strategy!r} has no FSDP2 equivalent here; valid values: "
                    f"{list(_RESHARD_OF_STRATEGY)} (or use DDP for NO_SHARD)")
            notes.append(f"sharding_strategy {name} is an FSDP1 setting; "
                         f"using reshard_after_forward={_RESHARD_OF_STRATEGY[name]}")
            if reshard is None or str(reshard).upper() in SHARDING_STRATEGIES:
                reshard = _RESHARD_OF_STRATEGY[name]
            self.sharding_strategy = None
        if isinstance(reshard, str) and reshard.upper() in _RESHARD_OF_STRATEGY:  # the peer's v1 spelling
            notes.append(f"reshard_after_forward={reshard!r} is the FSDP1 spelling; "
                         f"using {_RESHARD_OF_STRATEGY[reshard.upper()]}")
            reshard = _RESHARD_OF_STRATEGY[reshard.upper()]
        try:
            self.reshard_after_forward = True if reshard is None else to_bool("reshard_after_forward", reshard)
        except ValueError:
            raise ValueError(f"invalid value {reshard!r} for reshard_after_forward; FSDP2 takes a bool "
                             "(true: free gathered parameters after forward, false: keep them)") from None

    def _check_state_dict_type(self) -> None:
        raw = self.state_dict_type if self.state_dict_type is not None else _env("STATE_DICT_TYPE")
        name = getattr(raw, "name", raw)  # torch's StateDictType enum, or a string
        name = "SHARDED_STATE_DICT" if name is None else str(name).upper()
        if name.isdigit():
            name = {"1": "FULL_STATE_DICT", "3": "SHARDED_STATE_DICT"}.get(name, name)
        if name not in STATE_DICT_TYPES:
            raise ValueError(f"invalid state_dict_type {raw!r} for FSDP2; valid values: {list(STATE_DICT_TYPES)}")
        self.state_dict_type = name

    def _check_wrap_policy(self) -> None:
        policy = self.auto_wrap_policy if self.auto_wrap_policy is not None else (_env("AUTO_WRAP_POLICY") or "NO_WRAP")
        if getattr(policy, "__module__", None) == "torch.distributed.fsdp.wrap":  # torch's bare FSDP1 function
            policy = _TORCH_POLICY_NAMES.get(getattr(policy, "__name__", ""), policy)
        if not callable(policy):
            if str(policy).upper() not in AUTO_WRAP_POLICIES:
                raise ValueError(f"invalid auto_wrap_policy {policy!r}; valid values: {list(AUTO_WRAP_POLICIES)} "
                                 "or a callable policy(module) -> bool")
            policy = str(policy).upper()
        self.auto_wrap_policy = policy
        names = self.transformer_cls_names_to_wrap
        names = names if names is not None else _env("TRANSFORMER_CLS_TO_WRAP")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        self.transformer_cls_names_to_wrap = list(names) if names is not None else None
        size = self.min_num_params if self.min_num_params is not None else (_env("MIN_NUM_PARAMS") or "0")
        try:
            self.min_num_params = int(size)
        except (TypeError, ValueError):
            raise ValueError(f"invalid min_num_params {size!r}; valid values: an integer >= 0") from None
        if self.min_num_params < 0:
            raise ValueError(f"invalid min_num_params {size!r}; valid values: an integer >= 0")

    def ignored_module_list(self, model: Any) -> list[Any]:
        """The modules of ``model`` that ``ignored_modules`` names (a regex is full-matched)."""
        if self.ignored_modules is None:
            return []
        if isinstance(self.ignored_modules, str):
            pattern = re.compile(self.ignored_modules)
            return [m for name, m in model.named_modules() if name and pattern.fullmatch(name)]
        return list(self.ignored_modules)


def resolve_plugin(plugin: Any) -> FullyShardedDataParallelPlugin | None:
    """The plugin to use: ``plugin`` (ours, or the peer's object, converted field by field), else one
    built from the environment when ``ACCELERATE_USE_FSDP`` is true, else ``None``."""
    if isinstance(plugin, FullyShardedDataParallelPlugin):
        return plugin
    if plugin is not None:
        if type(plugin).__name__ != "FullyShardedDataParallelPlugin":
            raise TypeError(f"fsdp_plugin must be a FullyShardedDataParallelPlugin, not {type(plugin).__name__}")
        return _from_peer(plugin)
    return FullyShardedDataParallelPlugin() if fsdp_requested() else None


def _from_peer(plugin: Any) -> FullyShardedDataParallelPlugin:
    """Our plugin from the peer's (its enums become their names)."""
    sdt = getattr(plugin, "state_dict_type", None)
    offload = getattr(plugin, "cpu_offload", False)  # a bool, or torch's (CPU)OffloadPolicy / CPUOffload
    if not isinstance(offload, bool):
        offload = type(offload).__name__ == "CPUOffloadPolicy" or bool(getattr(offload, "offload_params", False))
    return FullyShardedDataParallelPlugin(
        reshard_after_forward=getattr(plugin, "reshard_after_forward", None) if isinstance(
            getattr(plugin, "reshard_after_forward", None), bool) else None,
        mixed_precision_policy=getattr(plugin, "mixed_precision_policy", None),
        auto_wrap_policy=getattr(plugin, "auto_wrap_policy", None),
        cpu_offload=offload,
        ignored_modules=getattr(plugin, "ignored_modules", None),
        state_dict_type=getattr(sdt, "name", sdt),
        activation_checkpointing=bool(getattr(plugin, "activation_checkpointing", False)),
        cpu_ram_efficient_loading=bool(getattr(plugin, "cpu_ram_efficient_loading", False)),
        transformer_cls_names_to_wrap=getattr(plugin, "transformer_cls_names_to_wrap", None),
        min_num_params=getattr(plugin, "min_num_params", None),
    )
