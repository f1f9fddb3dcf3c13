"""The config panel's form as plain data: load it from a config, check it, save it, show it as code.

No widgets here, so every rule can be unit-tested; :mod:`magics.panel.form`
only mirrors a :class:`FormState` into widgets and back.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from magics.panel.deepspeed import (
    DeepSpeedForm,
    apply_deepspeed_form,
    deepspeed_form_from_config,
    deepspeed_messages,
)
from magics.panel.fsdp import FsdpForm, apply_form, form_from_config, fsdp_messages
from magics.panel.own_fields import own_launch_kwargs, own_magic_flags, strategy_row
from magics.panel.rules import (
    compile_backend_choices,
    default_processes,
    effective_device,
    max_processes,
    precision_choices,
)
from magics.panel.table_options import (
    TableForm,
    apply_table_form,
    table_form_from_config,
    table_launch_kwargs,
    table_magic_flags,
    table_messages,
)
from notebook_accel.config import LaunchConfig, default_config_path, device_to_save
from notebook_accel.machine.hardware import Hardware, counted

_LOOPBACK = ("", "127.0.0.1", "localhost", "::1")


@dataclass
class FormState:
    """What the panel's fields hold. ``main_process_ip=""`` and ``main_process_port=0``
    mean unset (a free port is picked per launch)."""

    device: str = "auto"
    num_processes: int = 1
    mixed_precision: str = "no"
    start_method: str = "auto"
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = ""
    main_process_port: int = 0
    dynamo_backend: str = "no"  # torch.compile's backend (the file's dynamo_config)
    fsdp: FsdpForm = field(default_factory=FsdpForm)  # the strategy (DDP, FSDP, DEEPSPEED); FSDP's options
    deepspeed: DeepSpeedForm = field(default_factory=DeepSpeedForm)  # DeepSpeed's options
    options: TableForm = field(default_factory=dict)  # the table's other rows (snapshots, heal...)

    @property
    def strategy(self) -> str:
        """``"DDP"``, ``"FSDP"`` or ``"DEEPSPEED"``."""
        return self.fsdp.strategy


@dataclass(frozen=True)
class Message:
    """One inline validation message. ``level``: ``"error"`` (a wrong value: blocks Save, in
    red), ``"needed"`` (a value still to give: blocks Save, not in red, as nothing was typed
    wrong) or ``"note"``; ``field``: the form field it is about (a note is shown beside it),
    None for the form as a whole."""

    level: str
    text: str
    field: str | None = None


BLOCKING = ("error", "needed")  # levels that keep the form from being saved or tested
MULTI_NODE_PORT = 29500  # what the port field offers for several machines: torchrun's default


def state_from_config(cfg: LaunchConfig, hw: Hardware) -> FormState:
    """The form showing ``cfg``; an unset process count shows what the launcher would pick."""
    device = cfg.device_type or "auto"
    return FormState(
        device=device,
        num_processes=cfg.num_processes or default_processes(device, hw),
        mixed_precision=cfg.mixed_precision,
        start_method=cfg.start_method,
        num_machines=cfg.num_machines,
        machine_rank=cfg.machine_rank,
        main_process_ip=cfg.main_process_ip or "",
        main_process_port=cfg.main_process_port or 0,
        dynamo_backend=cfg.dynamo_backend or "no",
        fsdp=form_from_config(cfg),
        deepspeed=deepspeed_form_from_config(cfg),
        options=table_form_from_config(cfg),
    )


def saved_device(state: FormState, hw: Hardware | None = None) -> str | None:
    """The device the saved file names: the form's, or None for auto (with several processes,
    what auto is on ``hw``: :func:`notebook_accel.config.device_to_save`)."""
    device = None if state.device == "auto" else state.device
    if hw is None:
        return device
    return device_to_save(device, LaunchConfig(num_processes=state.num_processes,
                                               num_machines=state.num_machines), hw)


def config_from_state(state: FormState, base: LaunchConfig, hw: Hardware | None = None) -> LaunchConfig:
    """``base`` (the loaded file: its other keys and ``gpu_ids`` are kept) updated from the form;
    ``hw``: the machine, which says what device auto is when the file must name one
    (:func:`saved_device`).

    Raises:
        ValueError: a value :class:`LaunchConfig` rejects (``validate`` reports these first).
    """
    multi = state.num_machines > 1
    cfg = dataclasses.replace(
        base,
        num_processes=state.num_processes,
        mixed_precision=state.mixed_precision,
        start_method=state.start_method,
        num_machines=state.num_machines,
        machine_rank=state.machine_rank if multi else 0,
        main_process_ip=state.main_process_ip.strip() or None,
        main_process_port=state.main_process_port or None,
        dynamo_backend=None if state.dynamo_backend == "no" and base.dynamo_backend is None
        else state.dynamo_backend,
        extra=dict(base.extra),
    )
    cfg = apply_deepspeed_form(apply_form(cfg, state.fsdp), state.deepspeed, state.strategy)
    cfg = apply_table_form(cfg, state.options, base)
    return cfg.with_device(saved_device(state, hw))


def _process_messages(state: FormState, hw: Hardware) -> list[Message]:
    dev = effective_device(state.device, hw)
    n = state.num_processes
    if n < 1:
        return [Message("error", f"number of processes must be at least 1, not {n}")]
    if dev == "cuda" and not hw.gpu_count:
        return [Message("error", "device 'cuda' but no NVIDIA GPU is detected on this machine; "
                                 "choose cpu or auto")]
    if dev == "cuda" and n > hw.gpu_count:
        return [Message("error", f"{n} processes but only {counted(hw.gpu_count, 'GPU')} detected; "
                                 f"use at most {hw.gpu_count} (one per GPU), or device cpu")]
    if dev == "cpu" and n > max_processes(state.device, hw):
        return [Message("error", f"{n} processes is more than {max_processes(state.device, hw)} "
                                 f"(4 per CPU core) on {counted(hw.cpu_count, 'CPU core')}")]
    if dev == "cpu" and n > hw.cpu_count:
        return [Message("note", f"{n} processes on {counted(hw.cpu_count, 'CPU core')}: workers "
                                "share cores; fine for trying things out, slower for training",
                        "num_processes")]
    return []


def _node_messages(state: FormState) -> list[Message]:
    if state.num_machines < 1:
        return [Message("error", f"number of machines must be at least 1, not {state.num_machines}")]
    if state.num_machines == 1:
        return []
    out = []
    if not 0 <= state.machine_rank < state.num_machines:
        out.append(Message("error", f"machine rank must be 0..{state.num_machines - 1} (0 on the "
                                    f"main machine), not {state.machine_rank}"))
    if not state.main_process_ip.strip():
        out.append(Message("needed", "main process IP: give the main machine's address that "
                                     "every machine can reach"))
    elif state.main_process_ip.strip() in _LOOPBACK:
        out.append(Message("error", "main process IP: give the main machine's address that every "
                                    "machine can reach (not loopback)"))
    if not 1 <= state.main_process_port <= 65535:
        out.append(Message("error", "main process port: every machine must use the same port "
                                    "(1..65535)"))
    return out


def validate(state: FormState, hw: Hardware) -> list[Message]:
    """Everything wrong, missing or noteworthy about ``state`` on this hardware, what blocks
    Save first."""
    out = _process_messages(state, hw)
    dev = effective_device(state.device, hw)
    if state.device == "xla" and not hw.tpu:
        out.append(Message("error", "device 'xla' but no TPU is detected on this machine"))
    elif dev == "xla":
        out.append(Message("note", "TPU: torch_xla starts one worker per core; the number of "
                                   "processes is what torch_xla decides (or 1)", "device"))
    choice = {c.value: c for c in precision_choices(state.device, hw)}.get(state.mixed_precision)
    if choice is None:
        out.append(Message("error", f"unknown mixed precision {state.mixed_precision!r}"))
    elif not choice.enabled:
        out.append(Message("error", f"mixed precision {choice.value}: {choice.tooltip}",
                           "mixed_precision"))
    backend = {c.value: c for c in compile_backend_choices(state.device, hw)}.get(state.dynamo_backend)
    if backend is not None and not backend.enabled:  # a file's value, kept: it may be for another machine
        out.append(Message("note", f"torch.compile backend {backend.value!r} cannot run here "
                                   f"({backend.tooltip}): a launch here fails when prepare() "
                                   "compiles; choose another to run here", "dynamo_backend"))
    if state.start_method == "fork" and dev == "cuda":
        out.append(Message("note", "fork fails once CUDA is initialised in this kernel; "
                                   "auto switches to forkserver then", "start_method"))
    out += _node_messages(state)
    processes = state.num_processes * state.num_machines
    out += [Message(level, text) for level, text in fsdp_messages(state.fsdp, processes, dev)]
    out += [Message(level, text) for level, text in deepspeed_messages(
        state.deepspeed, state.strategy, processes, dev)]
    out += [Message(level, text, name) for level, text, name in table_messages(state.options)]
    return sorted(out, key=lambda m: (*BLOCKING, "note").index(m.level))


def _launch_kwargs(state: FormState, config_file: Path | None) -> list[tuple[str, object]]:
    kwargs = own_launch_kwargs(state)
    kwargs += table_launch_kwargs(state.options)
    strategy = strategy_row(state.strategy)
    if strategy is not None:
        kwargs.append((strategy.name, True))  # its options: the saved file's section (fsdp_config...)
    if state.strategy == "DEEPSPEED" and config_file and config_file != default_config_path():
        kwargs.append(("config_file", str(config_file)))  # DeepSpeed's settings: the file's
    return kwargs


def launcher_call(state: FormState, config_file: Path | None = None) -> str:
    """The equivalent Python, e.g. ``notebook_launcher(train, num_processes=2, mixed_precision='bf16')``;
    each keyword is its row's name (``own_fields``, ``table_options``). DeepSpeed's settings are
    the saved file's (``config_file``)."""
    args = ", ".join(f"{k}={v!r}" for k, v in _launch_kwargs(state, config_file))
    note = "train: your training function"
    if state.strategy == "DEEPSPEED":
        note += f"; DeepSpeed ZeRO-{state.deepspeed.zero_stage} from the saved file's deepspeed_config"
    return ("from notebook_accel import notebook_launcher\n\n"
            f"notebook_launcher(train, {args})  # {note}")


def magic_line(state: FormState, config_file: Path | None = None) -> str:
    """The equivalent ``%%accelerate`` line, each flag its row's. The multi-machine, TPU and
    DeepSpeed settings are read from the saved file: such a form adds ``--config FILE`` (the file as
    saved by the panel)."""
    parts = ["%%accelerate", *own_magic_flags(state)]
    parts += table_magic_flags(state.options)
    strategy = strategy_row(state.strategy)
    if strategy is not None and strategy.magic_flag:
        parts.append(strategy.magic_flag)
    if state.num_machines > 1 or state.device == "xla" or state.strategy == "DEEPSPEED":
        path = config_file or default_config_path()
        if path != default_config_path():
            parts += ["--config", shlex.quote(str(path))]
        what = "DeepSpeed" if state.strategy == "DEEPSPEED" else "multi-machine/TPU"
        return " ".join(parts) + f"\n# {what} settings are read from the saved file"
    return " ".join(parts)
