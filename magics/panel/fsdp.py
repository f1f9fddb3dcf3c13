"""The config panel's strategy choice: DDP, FSDP2 with its main ``fsdp_config`` options, or
DeepSpeed ZeRO (its options: :mod:`magics.panel.deepspeed`).

``FsdpForm`` is plain data (loaded from and written to a config file's
``distributed_type`` / ``fsdp_config``, checked by ``fsdp_messages``); ``FsdpFields``
mirrors it into widgets for :mod:`magics.panel.form` (its ``strategy``, a row of buttons,
is the panel's strategy selector).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from notebook_accel.config import LaunchConfig
from notebook_accel.strategies.fsdp.config import plugin_from_config
from notebook_accel.strategies.fsdp.plugin import AUTO_WRAP_POLICIES, STATE_DICT_TYPES

STRATEGIES = ("DDP", "FSDP", "DEEPSPEED")
_STRATEGY_LABELS = {"DDP": "DDP", "FSDP": "FSDP", "DEEPSPEED": "DeepSpeed"}


@dataclass
class FsdpForm:
    """The strategy (one of ``STRATEGIES``) and the FSDP options the panel shows (``classes``:
    comma-separated names)."""

    strategy: str = "DDP"
    wrap: str = "TRANSFORMER_BASED_WRAP"
    classes: str = ""
    min_num_params: int = 100_000_000
    reshard_after_forward: bool = True
    state_dict_type: str = "SHARDED_STATE_DICT"
    offload: bool = False

    def fsdp_config(self) -> dict[str, Any]:
        """The form as the peer's ``fsdp_config`` keys."""
        out: dict[str, Any] = {"fsdp_version": 2, "fsdp_auto_wrap_policy": self.wrap,
                               "fsdp_reshard_after_forward": self.reshard_after_forward,
                               "fsdp_state_dict_type": self.state_dict_type,
                               "fsdp_offload_params": self.offload}
        if self.wrap == "TRANSFORMER_BASED_WRAP":
            out["fsdp_transformer_layer_cls_to_wrap"] = self.classes.replace(" ", "")
        if self.wrap == "SIZE_BASED_WRAP":
            out["fsdp_min_num_params"] = self.min_num_params
        return out


def form_from_config(cfg: LaunchConfig) -> FsdpForm:
    """The strategy part of the form showing ``cfg`` (unreadable FSDP values show the defaults)."""
    if cfg.distributed_type == "DEEPSPEED":
        return FsdpForm(strategy="DEEPSPEED")
    if cfg.distributed_type != "FSDP":
        return FsdpForm()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP1 keys: the launcher reports them
        try:
            plugin = plugin_from_config(cfg.extra.get("fsdp_config"))
        except ValueError:
            return FsdpForm(strategy="FSDP")
    wrap = plugin.auto_wrap_policy if isinstance(plugin.auto_wrap_policy, str) else "NO_WRAP"
    return FsdpForm(strategy="FSDP", wrap=wrap, classes=",".join(plugin.transformer_cls_names_to_wrap or []),
                    min_num_params=plugin.min_num_params or FsdpForm.min_num_params,
                    reshard_after_forward=bool(plugin.reshard_after_forward),
                    state_dict_type=str(plugin.state_dict_type), offload=bool(plugin.cpu_offload))


def apply_form(cfg: LaunchConfig, form: FsdpForm) -> LaunchConfig:
    """``cfg`` with ``distributed_type``/``fsdp_config`` from ``form`` (other fsdp_config keys kept),
    or, for another strategy, without ``fsdp_config`` (the saved file has only the chosen strategy's
    section, as the peer writes it); call it before ``with_device``, which keeps ``FSDP`` and
    otherwise picks the DDP type."""
    extra = dict(cfg.extra)
    if form.strategy == "FSDP":
        extra["fsdp_config"] = {**(extra.get("fsdp_config") or {}), **form.fsdp_config()}
        return dataclasses.replace(cfg, distributed_type="FSDP", extra=extra)
    extra.pop("fsdp_config", None)
    return dataclasses.replace(cfg, distributed_type="NO" if cfg.distributed_type == "FSDP" else
                               cfg.distributed_type, extra=extra)


def fsdp_messages(form: FsdpForm, processes: int, device: str) -> list[tuple[str, str]]:
    """``(level, text)`` pairs: errors block Save, notes inform."""
    if form.strategy != "FSDP":
        return []
    if device == "xla":
        return [("error", "FSDP does not run on TPU (xla); choose DDP there")]
    out = []
    if form.wrap == "TRANSFORMER_BASED_WRAP" and not form.classes.strip():
        out.append(("note", "FSDP: no layer classes named: each model's own block classes "
                            "(its _no_split_modules, e.g. GPT2Block in transformers) are wrapped"))
    if processes == 1:
        out.append(("note", "FSDP with 1 process: nothing to shard; the model trains unsharded"))
    return out


class FsdpFields:
    """The widgets of the strategy choice; ``box`` holds them, ``form()`` reads them back.

    Args:
        form: the values to show.
        on_change: called on every change (the panel re-validates).
    """

    def __init__(self, form: FsdpForm, on_change: Callable[[dict], None]) -> None:
        import ipywidgets as widgets

        from magics.panel.controls import LABEL as label
        from magics.panel.controls import ButtonChoice, checkbox, field_layout

        self.strategy = ButtonChoice([(_STRATEGY_LABELS[s], s) for s in STRATEGIES], form.strategy,
                                     "Strategy",
                                     tooltips=["a full copy per process (DistributedDataParallel)",
                                               "shard parameters, gradients and optimizer state "
                                               "(torch FSDP2)",
                                               "DeepSpeed ZeRO: shard optimizer state (stage 1), "
                                               "+ gradients (2), + parameters (3)"])
        self.wrap = widgets.Dropdown(options=list(AUTO_WRAP_POLICIES), value=form.wrap, description="Wrap policy",
                                     style=label, layout=field_layout())
        self.classes = widgets.Text(value=form.classes, description="Layer classes", style=label,
                                    placeholder="Block,DecoderLayer", layout=field_layout())
        self.min_num_params = widgets.BoundedIntText(value=form.min_num_params, min=0, max=10**12,
                                                     description="Min parameters", style=label,
                                                     layout=field_layout())
        self.reshard = checkbox(form.reshard_after_forward, "Reshard after forward",
                                "free gathered weights after forward (less memory, ZeRO-3)")
        self.state_dict_type = widgets.Dropdown(options=list(STATE_DICT_TYPES), value=form.state_dict_type,
                                                description="Checkpoints", style=label, layout=field_layout())
        self.offload = checkbox(form.offload, "Offload to CPU")
        self.options = widgets.VBox([self.wrap, self.classes, self.min_num_params, self.reshard,
                                     self.state_dict_type, self.offload])
        self.box = widgets.VBox([self.strategy, self.options])
        for w in (self.strategy, self.wrap, self.classes, self.min_num_params, self.reshard,
                  self.state_dict_type, self.offload):
            w.observe(on_change, names="value")
        self.refresh()

    def form(self) -> FsdpForm:
        """The values shown."""
        return FsdpForm(strategy=self.strategy.value, wrap=self.wrap.value, classes=self.classes.value,
                        min_num_params=self.min_num_params.value, reshard_after_forward=self.reshard.value,
                        state_dict_type=self.state_dict_type.value, offload=self.offload.value)

    def refresh(self) -> None:
        """Show the FSDP options only for FSDP, and each wrap policy's own field."""
        self.options.layout.display = "" if self.strategy.value == "FSDP" else "none"
        self.classes.layout.display = "" if self.wrap.value == "TRANSFORMER_BASED_WRAP" else "none"
        self.min_num_params.layout.display = "" if self.wrap.value == "SIZE_BASED_WRAP" else "none"
