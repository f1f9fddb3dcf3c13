"""The launch options the panel's own fields show (a row's ``panel_field``: device, processes,
mixed precision, start method, torch.compile, the machines; the strategy selector's choice, a
strategy's row in ``strategies.registry``), read from the options table: which
:class:`~magics.panel.state.FormState` attribute holds each, which values a launch would differ
by, and their code equivalents (the row's ``notebook_launcher`` keyword and ``%%accelerate``
flag), so the panel names no option by hand. The file's other rows get fields of their own
(:mod:`magics.panel.table_options`).
"""

from __future__ import annotations

import shlex
from typing import Any

from notebook_accel.contract import OPTIONS, LaunchOption
from notebook_accel.strategies.registry import STRATEGIES

# FormState attributes of the multi-machine settings: with several machines the %%accelerate
# line leaves them to the saved file (``--config``); a machine's rank and the main machine's
# address count only then (the panel hides them for one machine), and are shown even at their
# default then (each machine's copy of the code needs its own rank)
MULTI_MACHINE = ("num_machines", "machine_rank", "main_process_ip", "main_process_port")
_PER_MACHINE = ("machine_rank", "main_process_ip")


def own_rows() -> list[LaunchOption]:
    """The rows the panel's own fields show, in the table's order."""
    return [o for o in OPTIONS.values() if o.panel_field]


def field_row(panel_field: str) -> LaunchOption:
    """The row a panel field shows (``"num_machines"``: ``num_nodes``): its help is the field's tip."""
    return next(o for o in own_rows() if o.panel_field == panel_field)


def attribute(option: LaunchOption) -> str:
    """The ``FormState`` attribute holding ``option``'s value: its config-file key, else its
    name (``device``: the file says it through ``distributed_type`` / ``use_cpu``)."""
    return option.file_key or option.name


def _unset(option: LaunchOption, value: Any) -> bool:
    """Whether a field's value stands for "unset": an empty text, a number below the row's
    lowest (port 0), or ``"auto"`` where the row has no such choice (device)."""
    if value == "" or value == "auto" and "auto" not in option.choices:
        return True
    return option.low is not None and isinstance(value, int) and value < option.low


def chosen(state: Any) -> list[tuple[LaunchOption, Any]]:
    """The own fields' values a launch would differ by (set, and not the row's default), with
    their rows, in the table's order."""
    out = []
    for option in own_rows():
        value = getattr(state, attribute(option))
        value = value.strip() if isinstance(value, str) else value
        if attribute(option) in _PER_MACHINE:
            if state.num_machines > 1:
                out.append((option, value))
        elif not _unset(option, value) and value != option.default:
            out.append((option, value))
    return out


def own_launch_kwargs(state: Any) -> list[tuple[str, Any]]:
    """``notebook_launcher``'s keywords for the own fields set."""
    return [(option.name, value) for option, value in chosen(state) if option.argument]


def own_magic_flags(state: Any) -> list[str]:
    """The ``%%accelerate`` flags for the own fields set (those the magic has; the multi-machine
    settings of a form for several machines are the saved file's)."""
    parts: list[str] = []
    for option, value in chosen(state):
        flag = option.short_flag or option.magic_flag
        if flag and not (state.num_machines > 1 and attribute(option) in MULTI_MACHINE):
            parts += [flag, shlex.quote(str(value))]
    return parts


def strategy_row(strategy: str) -> LaunchOption | None:
    """The launch option of the strategy the panel's selector holds (``"FSDP"``: ``fsdp``), from
    the strategies' registry; None where it has none (DDP: what a launch does unasked)."""
    for registration in STRATEGIES.values():
        if strategy in registration.distributed_types and registration.option is not None:
            return registration.option
    return None
