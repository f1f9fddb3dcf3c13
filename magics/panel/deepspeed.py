"""The config panel's DeepSpeed ZeRO options (strategy ``DEEPSPEED``): the peer's ``deepspeed_config`` keys.

``DeepSpeedForm`` is plain data (loaded from and written to a config file's
``deepspeed_config``, checked by ``deepspeed_messages`` with
:func:`notebook_accel.strategies.deepspeed.config.plugin_from_config`'s own validation);
``DeepSpeedFields`` mirrors it into widgets. The strategy selector is
:class:`magics.panel.fsdp.FsdpFields`'s; these functions take its value.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from notebook_accel.config import LaunchConfig
from notebook_accel.flags import to_bool
from notebook_accel.strategies.deepspeed.config import plugin_from_config
from notebook_accel.strategies.deepspeed.plugin import OFFLOAD_DEVICES, ZERO_STAGES

DEEPSPEED = "DEEPSPEED"
# deepspeed_config keys the panel shows (the others are kept as they are in the file)
SHOWN_KEYS = ("zero_stage", "offload_optimizer_device", "offload_param_device", "offload_optimizer_nvme_path",
              "offload_param_nvme_path", "gradient_clipping", "zero3_save_16bit_model")
STAGE_LABELS = {0: "0: no sharding (DDP-like)", 1: "1: optimizer state", 2: "2: + gradients",
                3: "3: + parameters"}


@dataclass
class DeepSpeedForm:
    """The DeepSpeed options the panel shows; ``gradient_clipping`` as typed ("": no clipping),
    ``other``: the file's other ``deepspeed_config`` keys (kept on save)."""

    zero_stage: int = 2  # the plugin's and the peer's default: no gather cost, weights stay whole
    offload_optimizer_device: str = "none"
    offload_param_device: str = "none"
    offload_optimizer_nvme_path: str = ""
    offload_param_nvme_path: str = ""
    gradient_clipping: str = ""
    zero3_save_16bit_model: bool = False
    other: dict[str, Any] = field(default_factory=dict)

    @property
    def config_file(self) -> str:
        """``deepspeed_config_file`` (a DeepSpeed JSON that decides the settings), or ""."""
        return str(self.other.get("deepspeed_config_file") or "")

    def deepspeed_config(self) -> dict[str, Any]:
        """The form as the peer's ``deepspeed_config`` keys (with a JSON file: the file's keys as they are)."""
        if self.config_file:
            return dict(self.other)
        out = {k: v for k, v in self.other.items() if k not in SHOWN_KEYS}
        out.update(zero_stage=self.zero_stage, offload_optimizer_device=self.offload_optimizer_device,
                   offload_param_device=self.offload_param_device,
                   zero3_save_16bit_model=self.zero3_save_16bit_model)
        for kind in ("optimizer", "param"):
            if getattr(self, f"offload_{kind}_device") == "nvme":
                out[f"offload_{kind}_nvme_path"] = getattr(self, f"offload_{kind}_nvme_path").strip()
        clipping = self.gradient_clipping.strip()
        if clipping:
            out["gradient_clipping"] = _number(clipping)
        return out


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text  # "auto", or a mistake that deepspeed_messages reports


def _choice(value: Any, valid: tuple, default: Any) -> Any:
    value = value.strip().lower() if isinstance(value, str) else value
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if value in valid else default


def deepspeed_form_from_config(cfg: LaunchConfig) -> DeepSpeedForm:
    """The DeepSpeed part of the form showing ``cfg``: the file's values, each as it is (so a bad
    combination shows, and ``deepspeed_messages`` flags it); an unreadable value shows the default.
    With ``deepspeed_config_file``, the values that JSON gives."""
    raw = cfg.extra.get("deepspeed_config") if cfg.distributed_type == DEEPSPEED else None
    if not isinstance(raw, dict):
        return DeepSpeedForm()
    if raw.get("deepspeed_config_file"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                raw = {**raw, **_plugin_values(plugin_from_config(raw))}
        except ValueError:
            pass  # deepspeed_messages says why
    try:
        save16 = to_bool("zero3_save_16bit_model", raw.get("zero3_save_16bit_model", False))
    except ValueError:
        save16 = False
    clipping = raw.get("gradient_clipping")
    return DeepSpeedForm(
        zero_stage=_choice(raw.get("zero_stage", 2), ZERO_STAGES, 2),
        offload_optimizer_device=_choice(raw.get("offload_optimizer_device") or "none", OFFLOAD_DEVICES, "none"),
        offload_param_device=_choice(raw.get("offload_param_device") or "none", OFFLOAD_DEVICES, "none"),
        offload_optimizer_nvme_path=str(raw.get("offload_optimizer_nvme_path") or ""),
        offload_param_nvme_path=str(raw.get("offload_param_nvme_path") or ""),
        gradient_clipping="" if clipping in (None, "") else str(clipping),
        zero3_save_16bit_model=save16, other=dict(cfg.extra["deepspeed_config"]))


def _plugin_values(plugin: Any) -> dict[str, Any]:
    values = {k: getattr(plugin, k) for k in SHOWN_KEYS if k != "gradient_clipping"}
    values["gradient_clipping"] = plugin.deepspeed_config.get("gradient_clipping")
    return values


def apply_deepspeed_form(cfg: LaunchConfig, form: DeepSpeedForm, strategy: str) -> LaunchConfig:
    """``cfg`` with ``distributed_type: DEEPSPEED`` and ``deepspeed_config`` from ``form`` when
    ``strategy`` is DeepSpeed; otherwise without ``deepspeed_config`` (a DeepSpeed file becomes
    ``NO``, for ``with_device`` to pick the DDP type, as :func:`magics.panel.fsdp.apply_form` does).

    The section written is exactly ``form.deepspeed_config()`` (the file's other keys travel in
    ``form.other``), so what ``deepspeed_messages`` checked is what is saved."""
    extra = dict(cfg.extra)
    if strategy == DEEPSPEED:
        extra["deepspeed_config"] = form.deepspeed_config()
        return dataclasses.replace(cfg, distributed_type=DEEPSPEED, extra=extra)
    extra.pop("deepspeed_config", None)
    return dataclasses.replace(cfg, distributed_type="NO" if cfg.distributed_type == DEEPSPEED else
                               cfg.distributed_type, extra=extra)


def _clipping_error(text: str) -> str | None:
    text = text.strip()
    if text in ("", "auto"):
        return None
    try:
        if float(text) >= 0:
            return None
    except ValueError:
        pass
    return (f"DeepSpeed: gradient clipping {text!r} is not a number; give the max gradient norm "
            "(e.g. 1.0), or leave it empty for no clipping")


def deepspeed_messages(form: DeepSpeedForm, strategy: str, processes: int, device: str) -> list[tuple[str, str]]:
    """``(level, text)`` pairs: errors block Save, notes inform. The values are checked by the
    launcher's own ``plugin_from_config``, so what it would refuse is refused here."""
    if strategy != DEEPSPEED:
        return []
    if device == "xla":
        return [("error", "DeepSpeed does not run on TPU (xla); choose DDP there")]
    out = []
    bad_clipping = _clipping_error(form.gradient_clipping) if not form.config_file else None
    if bad_clipping:
        out.append(("error", bad_clipping))
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # multi-machine keys: the launcher reports them
                plugin_from_config(form.deepspeed_config())
        except ValueError as err:
            out.append(("error", f"DeepSpeed: {err}"))
    if not form.config_file and form.zero_stage == 0 and form.offload_optimizer_device != "none":
        out.append(("error", f"DeepSpeed: offload_optimizer_device {form.offload_optimizer_device!r} "
                             "needs zero_stage 1-3 (stage 0 has no ZeRO optimizer to offload)"))
    if form.config_file:
        out.append(("note", f"DeepSpeed: the settings come from deepspeed_config_file {form.config_file} "
                            "(shown read-only; edit that file to change them)"))
    if processes == 1:
        out.append(("note", "DeepSpeed with 1 process: nothing to shard; the job trains without "
                            "DeepSpeed (and warns)"))
    if importlib.util.find_spec("deepspeed") is None:
        out.append(("note", "deepspeed is not installed in this environment: "
                            "DS_BUILD_OPS=0 pip install deepspeed before launching"))
    return out


class DeepSpeedFields:
    """The DeepSpeed option widgets; ``box`` holds them, ``form()`` reads them back.

    Args:
        form: the values to show.
        on_change: called on every change (the panel re-validates).
    """

    def __init__(self, form: DeepSpeedForm, on_change: Callable[[dict], None]) -> None:
        import ipywidgets as widgets

        from magics.panel.controls import LABEL as label
        from magics.panel.controls import checkbox, field_layout, tip

        self._other = dict(form.other)
        self.zero_stage = widgets.Dropdown(options=[(STAGE_LABELS[s], s) for s in ZERO_STAGES],
                                           value=form.zero_stage, description="ZeRO stage", style=label, layout=field_layout(),
                                           **tip("what is sharded over the processes"))
        self.offload_optimizer = widgets.Dropdown(options=list(OFFLOAD_DEVICES), value=form.offload_optimizer_device,
                                                  description="Offload optimizer", style=label, layout=field_layout(),
                                                  **tip("keep optimizer state (and its step) on cpu or nvme"))
        self.optimizer_nvme_path = widgets.Text(value=form.offload_optimizer_nvme_path, style=label,
                                                layout=field_layout(),
                                                description="Optimizer NVMe path", placeholder="/local_nvme")
        self.offload_param = widgets.Dropdown(options=list(OFFLOAD_DEVICES), value=form.offload_param_device,
                                              description="Offload parameters", style=label, layout=field_layout(),
                                              **tip("ZeRO stage 3 only"))
        self.param_nvme_path = widgets.Text(value=form.offload_param_nvme_path, style=label,
                                            layout=field_layout(),
                                            description="Parameter NVMe path", placeholder="/local_nvme")
        self.clipping = widgets.Text(value=form.gradient_clipping, description="Gradient clipping", style=label, layout=field_layout(),
                                     placeholder="none (max norm, e.g. 1.0)")
        self.save16 = checkbox(form.zero3_save_16bit_model, "Save 16-bit model (ZeRO-3)",
                               "let save_model / get_state_dict gather ZeRO-3's weights")
        self.fields = (self.zero_stage, self.offload_optimizer, self.optimizer_nvme_path, self.offload_param,
                       self.param_nvme_path, self.clipping, self.save16)
        self.box = widgets.VBox(list(self.fields))
        self.box.add_class("notebook-accel-deepspeed")
        for w in self.fields:
            w.observe(on_change, names="value")
        self.refresh(DEEPSPEED)

    def form(self) -> DeepSpeedForm:
        """The values shown."""
        return DeepSpeedForm(zero_stage=self.zero_stage.value, offload_optimizer_device=self.offload_optimizer.value,
                             offload_param_device=self.offload_param.value,
                             offload_optimizer_nvme_path=self.optimizer_nvme_path.value,
                             offload_param_nvme_path=self.param_nvme_path.value, gradient_clipping=self.clipping.value,
                             zero3_save_16bit_model=self.save16.value, other=dict(self._other))

    def refresh(self, strategy: str) -> None:
        """Show the options only for DeepSpeed; the stage-3 options enabled for stage 3 (or while
        they hold a value to undo); everything read-only when a DeepSpeed JSON decides."""
        self.box.layout.display = "" if strategy == DEEPSPEED else "none"
        stage3 = self.zero_stage.value == 3
        self.offload_param.disabled = not stage3 and self.offload_param.value == "none"
        self.save16.disabled = not stage3 and not self.save16.value
        self.optimizer_nvme_path.layout.display = "" if self.offload_optimizer.value == "nvme" else "none"
        self.param_nvme_path.layout.display = "" if self.offload_param.value == "nvme" else "none"
        if self._other.get("deepspeed_config_file"):
            for w in self.fields:
                w.disabled = True
