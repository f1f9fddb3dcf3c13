"""``DeepSpeedPlugin``: the peer's DeepSpeed settings, turned into a DeepSpeed config dict.

Fields and environment variables have the peer's names (``ACCELERATE_USE_DEEPSPEED=true``
turns DeepSpeed on; ``ACCELERATE_DEEPSPEED_ZERO_STAGE``, ...), so a config file,
``accelerate launch`` or a plain ``torchrun`` with those variables all reach the same
plugin. A field left ``None`` is read from its variable. The fields fill the ``"auto"`` (or
missing) values of a config: ``hf_ds_config`` (a dict or a JSON file), else an all-``"auto"`` one.
Values the job decides (micro batch, accumulation, clipping, precision) stay ``"auto"``
here and are filled by ``runtime.fill_auto`` at ``prepare``. Nothing here imports deepspeed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from notebook_accel.flags import to_bool

USE_DEEPSPEED = "ACCELERATE_USE_DEEPSPEED"
ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
ENV = {  # plugin field -> the peer's variable
    "gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "offload_optimizer_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
    "offload_param_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
    "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    "hf_ds_config": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
}
# plugin field -> its place in a DeepSpeed config (dotted)
CONFIG_PATHS = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}


def deepspeed_requested() -> bool:
    """Whether the environment asks for DeepSpeed (``ACCELERATE_USE_DEEPSPEED``, set by the launcher)."""
    return to_bool(USE_DEEPSPEED, os.environ.get(USE_DEEPSPEED, "false"))


def _from_env(name: str) -> str | None:
    value = os.environ.get(ENV[name])
    return None if value is None or value.strip().lower() in ("", "none", "null") else value


def get_value(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``config["a"]["b"]`` for ``"a.b"`` (``default`` where a level is missing)."""
    node: Any = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def set_value(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``config["a"]["b"] = value`` for ``"a.b"``, creating the levels."""
    *parents, last = dotted.split(".")
    node = config
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def is_auto(config: dict[str, Any], dotted: str) -> bool:
    """Whether ``dotted`` is ``"auto"`` in ``config``."""
    return get_value(config, dotted) == "auto"


@dataclass
class DeepSpeedPlugin:
    """How ``prepare`` trains through a DeepSpeed engine (the peer's field names).

    Args:
        hf_ds_config: a DeepSpeed config (a dict, or the path of a JSON file) used instead of
            the one the other fields generate; its ``"auto"`` values are filled from the job.
        gradient_accumulation_steps: micro-steps per optimizer step (default: the Accelerator's).
        gradient_clipping: clip the global gradient norm to this inside the engine's step.
        zero_stage: 0 (DDP-like), 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters).
        offload_optimizer_device / offload_param_device: ``"none"``, ``"cpu"`` or ``"nvme"``
            (parameters: stage 3 only).
        offload_optimizer_nvme_path / offload_param_nvme_path: where ``"nvme"`` offloads to.
        zero3_init_flag: build models under ``deepspeed.zero.Init`` (stage 3; see
            ``zero3_init_context_manager``).
        zero3_save_16bit_model: let ``get_state_dict`` / ``save_model`` gather ZeRO-3's
            partitioned weights into one state dict.
        is_train_batch_min, transformer_moe_cls_names, enable_msamp, msamp_opt_level: the
            peer's, accepted; MS-AMP is refused.

    Raises:
        ValueError: a bad value (naming it and the valid ones), a missing config file, or a
            config without ``zero_optimization``.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | str | None = None
    gradient_clipping: float | str | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None
    deepspeed_config: dict[str, Any] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        for name in ENV:
            if getattr(self, name) is None:
                setattr(self, name, _from_env(name))
        if self.enable_msamp:
            raise ValueError("enable_msamp=True: MS-AMP (fp8) is not supported; use mixed_precision 'bf16'")
        self.deepspeed_config = (self._read_config(self.hf_ds_config) if self.hf_ds_config is not None else
                                 {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                  "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": "auto"}})
        self._fill_from_fields()
        self._check_values()
        self.deepspeed_config["steps_per_print"] = float("inf")  # no engine logging in the cell
        self.deepspeed_config.setdefault("zero_allow_untested_optimizer", True)  # any torch optimizer
        self.zero3_init_flag = to_bool("zero3_init_flag", self.zero3_init_flag or False)
        self.zero3_save_16bit_model = get_value(
            self.deepspeed_config, CONFIG_PATHS["zero3_save_16bit_model"], False) is True  # "auto": off

    # ---- building the config ---------------------------------------------------------
    @staticmethod
    def _read_config(source: Any) -> dict[str, Any]:
        if isinstance(source, dict):
            config = copy.deepcopy(source)
        elif hasattr(source, "config") and isinstance(source.config, dict):  # the peer's HfDeepSpeedConfig
            config = copy.deepcopy(source.config)
        elif isinstance(source, (str, os.PathLike)):
            path = Path(source).expanduser()
            if not path.is_file():
                raise ValueError(f"hf_ds_config / deepspeed_config_file {str(source)!r}: no such file")
            try:
                config = json.loads(path.read_text())
            except json.JSONDecodeError as err:
                raise ValueError(f"deepspeed_config_file {str(path)!r} is not valid JSON: {err}") from None
        else:
            raise ValueError(f"hf_ds_config={source!r}: pass a dict or the path of a DeepSpeed JSON config")
        if "zero_optimization" not in config:
            raise ValueError("the DeepSpeed config has no 'zero_optimization' section; add e.g. "
                             "\"zero_optimization\": {\"stage\": 2}")
        config.setdefault("gradient_accumulation_steps", "auto")
        return config

    def _fill_from_fields(self) -> None:
        """Fields given (or from the environment) fill the config's ``"auto"`` or missing values."""
        for name, dotted in CONFIG_PATHS.items():
            value = getattr(self, name)
            current = get_value(self.deepspeed_config, dotted)
            if value is not None and (current is None or current == "auto"):
                set_value(self.deepspeed_config, dotted, self._typed(name, value))
        for name, dotted in CONFIG_PATHS.items():  # the fields then show the config's values
            current = get_value(self.deepspeed_config, dotted)
            if current is not None and current != "auto":
                setattr(self, name, current)
        if is_auto(self.deepspeed_config, "zero_optimization.stage"):  # the peer's default
            set_value(self.deepspeed_config, "zero_optimization.stage", 2)
            self.zero_stage = 2

    @staticmethod
    def _typed(name: str, value: Any) -> Any:
        """``value`` from a variable or a YAML file as the type DeepSpeed expects."""
        if value == "auto" or not isinstance(value, str):
            return value
        try:
            if name in ("zero_stage", "gradient_accumulation_steps"):
                return int(value)
            if name == "gradient_clipping":
                return float(value)
        except ValueError:
            raise ValueError(f"invalid value {value!r} for {name} ({ENV.get(name, name)}); "
                             "valid values: a number or 'auto'") from None
        if name == "zero3_save_16bit_model":
            return to_bool(name, value)
        if name.endswith("_device"):
            return value.lower()
        return value

    def _check_values(self) -> None:
        config = self.deepspeed_config
        stage = get_value(config, "zero_optimization.stage", 0)
        if stage not in ZERO_STAGES:
            raise ValueError(f"invalid zero_stage {stage!r}; valid values: {list(ZERO_STAGES)}")
        self.zero_stage = stage
        for kind in ("optimizer", "param"):
            device = get_value(config, f"zero_optimization.offload_{kind}.device", "none")
            device = "none" if device is None else str(device).lower()
            if device not in OFFLOAD_DEVICES:
                raise ValueError(f"invalid offload_{kind}_device {device!r}; valid values: {list(OFFLOAD_DEVICES)}")
            if device == "nvme" and not get_value(config, f"zero_optimization.offload_{kind}.nvme_path"):
                raise ValueError(f"offload_{kind}_device 'nvme' needs offload_{kind}_nvme_path")
            setattr(self, f"offload_{kind}_device", device)
        if self.offload_optimizer_device != "none" and stage == 0:
            raise ValueError(f"offload_optimizer_device {self.offload_optimizer_device!r} needs zero_stage 1, 2 "
                             "or 3 (stage 0 has no partitioned optimizer to offload)")
        if self.offload_param_device != "none" and stage != 3:
            raise ValueError(f"offload_param_device {self.offload_param_device!r} needs zero_stage 3, "
                             f"not {stage}; offload_optimizer_device works with stages 1-3")
        gas = config.get("gradient_accumulation_steps")
        if gas != "auto" and (not isinstance(gas, int) or gas < 1):
            raise ValueError(f"invalid gradient_accumulation_steps {gas!r}; valid values: an integer >= 1 or 'auto'")

    # ---- what the runtime asks ---------------------------------------------------------
    def is_zero3(self) -> bool:
        """Whether parameters are partitioned (stage 3)."""
        return self.zero_stage == 3

    def zero3_init_context_manager(self, enable: bool | None = None) -> contextlib.AbstractContextManager[Any]:
        """``deepspeed.zero.Init`` for building a model straight into ZeRO-3 partitions (each rank
        allocates only its share); a null context unless stage 3 and ``zero3_init_flag`` (or ``enable``).

        Call it inside the launched function, after ``Accelerator()`` (it needs the process group).
        """
        wanted = self.zero3_init_flag if enable is None else enable
        if not (wanted and self.is_zero3()):
            return contextlib.nullcontext()
        import deepspeed

        config = {k: v for k, v in self.deepspeed_config.items() if v != "auto"}
        config = {**config, "train_micro_batch_size_per_gpu": 1}  # Init reads only the ZeRO section
        return deepspeed.zero.Init(config_dict_or_path=config)


def resolve_plugin(plugin: Any) -> DeepSpeedPlugin | None:
    """The plugin to use: ``plugin`` (ours, or the peer's object, converted field by field), else one
    built from the environment when ``ACCELERATE_USE_DEEPSPEED`` is true, else ``None``."""
    if isinstance(plugin, DeepSpeedPlugin):
        return plugin
    if isinstance(plugin, dict):  # the peer accepts {name: plugin}; one is used at a time
        if len(plugin) != 1:
            raise ValueError(f"deepspeed_plugin: {len(plugin)} plugins given ({sorted(plugin)}); "
                             "only one DeepSpeed plugin per Accelerator is supported")
        plugin = next(iter(plugin.values()))
        return resolve_plugin(plugin)
    if plugin is not None:
        if type(plugin).__name__ != "DeepSpeedPlugin":
            raise TypeError(f"deepspeed_plugin must be a DeepSpeedPlugin, not {type(plugin).__name__}")
        return DeepSpeedPlugin(hf_ds_config=copy.deepcopy(getattr(plugin, "deepspeed_config", None)),
                               zero3_init_flag=getattr(plugin, "zero3_init_flag", None))
    return DeepSpeedPlugin() if deepspeed_requested() else None


_CONFIG_SECTIONS_UNSUPPORTED = (
    "{name} stands for the DeepSpeed config's {section!r} section, which notebook_accel does not support: "
    "{instead} and remove that section from the config")


class DummyOptim:
    """The peer's placeholder for an optimizer defined in the DeepSpeed config (not supported here).

    Raises:
        ValueError: always, naming what to do instead (a torch optimizer passed to ``prepare``).
    """

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        raise ValueError(_CONFIG_SECTIONS_UNSUPPORTED.format(
            name="DummyOptim", section="optimizer",
            instead=f"create a torch optimizer (e.g. torch.optim.AdamW(params, lr={lr})) for prepare()"))


class DummyScheduler:
    """The peer's placeholder for a scheduler defined in the DeepSpeed config (not supported here).

    Raises:
        ValueError: always, naming what to do instead (a torch scheduler passed to ``prepare``).
    """

    def __init__(self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Any = None, **kwargs: Any) -> None:
        raise ValueError(_CONFIG_SECTIONS_UNSUPPORTED.format(
            name="DummyScheduler", section="scheduler",
            instead="create a torch LR scheduler (e.g. transformers.get_scheduler(...)) for prepare()"))
