"""The config panel's fields made from the launch options table: every row the config file holds
(``file_key``, written by ``notebook-accel config``: ``config_flag``) that no field of the panel's
own shows (``panel_field``) gets one here, by its kind: a checkbox for a switch, a dropdown for
choices, a text box otherwise (empty: unset). So a new launch option reaches the panel with its
row, as it reaches the flags, the environment and the file (``snapshot_every``, ``snapshot_dir``,
``heal``...).

``TableForm`` is plain data (loaded from and written to a config, checked by ``table_messages``
with the rows' own validator); ``TableFields`` mirrors it into widgets for
:mod:`magics.panel.form`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from notebook_accel.config import LaunchConfig
from notebook_accel.contract import OPTIONS, LaunchOption

TableForm = dict[str, Any]  # option name -> what its field holds (a switch's bool, else text; "": unset)
_WORDS = {"gpu": "GPU", "ids": "IDs", "dir": "folder"}


def table_rows() -> list[LaunchOption]:
    """The rows the panel shows through this module, in the table's order."""
    return [o for o in OPTIONS.values() if o.file_key and o.config_flag and not o.panel_field]


def label(option: LaunchOption) -> str:
    """A field's label made from its option's name: ``snapshot_every`` -> ``Snapshot every``."""
    words = [_WORDS.get(word, word) for word in option.name.split("_")]
    return " ".join(words)[:1].upper() + " ".join(words)[1:]


def table_form_from_config(cfg: LaunchConfig) -> TableForm:
    """The fields showing ``cfg`` (a switch the file leaves unset shows its default)."""
    form: TableForm = {}
    for option in table_rows():
        value = getattr(cfg, option.file_key)
        if option.kind is bool:
            form[option.name] = option.default if value is None else bool(value)
        else:
            form[option.name] = "" if value is None else str(value)
    return form


def _shown(form: TableForm, option: LaunchOption) -> Any:
    """What ``option``'s field holds in ``form`` (a form without it: unset, a switch's default)."""
    return form.get(option.name, option.default if option.kind is bool else "")


def _parsed(option: LaunchOption, shown: Any) -> Any:
    """The value a field holds, checked by its row (None: unset).

    Raises:
        ValueError: a bad value, started by the field's label.
    """
    if option.kind is bool:
        return option.check(shown, label(option))
    text = str(shown).strip()
    if not text:
        return None
    value: Any = int(text) if option.kind is int and text.lstrip("-").isdigit() else text
    if option.kind is float:
        try:
            value = float(text)
        except ValueError:
            pass
    return option.check(value, label(option))


def table_messages(form: TableForm) -> list[tuple[str, str, str]]:
    """``(level, text, field)`` for every field holding a bad value."""
    out = []
    for option in table_rows():
        try:
            _parsed(option, _shown(form, option))
        except ValueError as error:
            out.append(("error", str(error), option.name))
    return out


def apply_table_form(cfg: LaunchConfig, form: TableForm, base: LaunchConfig) -> LaunchConfig:
    """``cfg`` with the fields' values (a switch left at its default stays unset where ``base``
    had it unset, so saving writes only what was chosen).

    Raises:
        ValueError: a bad value (``table_messages`` reports these first).
    """
    changes = {}
    for option in table_rows():
        value = _parsed(option, _shown(form, option))
        if option.kind is bool and value == option.default and getattr(base, option.file_key) is None:
            value = None
        changes[option.file_key] = value
    return dataclasses.replace(cfg, **changes)


def _chosen(form: TableForm) -> list[tuple[LaunchOption, Any]]:
    """The set fields whose value differs from a launch's default, for the code equivalents (a
    pool's options are not a launch's, so they are left out)."""
    out = []
    for option in table_rows():
        try:
            value = _parsed(option, _shown(form, option))
        except ValueError:
            continue
        if value is not None and value != option.default and option.argument and not option.pool_only:
            out.append((option, value))
    return out


def table_launch_kwargs(form: TableForm) -> list[tuple[str, Any]]:
    """``notebook_launcher``'s keywords for the fields set."""
    return [(option.name, value) for option, value in _chosen(form)]


def table_magic_flags(form: TableForm) -> list[str]:
    """The ``%%accelerate`` flags for the fields set (those the magic has)."""
    import shlex

    parts: list[str] = []
    for option, value in _chosen(form):
        if not option.magic_flag:
            continue
        if option.switch:
            parts.append(option.magic_flag if value else "--no-" + option.magic_flag[2:])
        else:
            parts += [option.magic_flag, shlex.quote(str(value))]
    return parts


class TableFields:
    """The widgets of the table's rows; ``box`` holds them, ``fields`` maps an option's name to
    its widget, ``form()`` reads them back.

    Args:
        form: the values to show.
        on_change: called on every change (the panel re-validates).
    """

    def __init__(self, form: TableForm, on_change: Callable[[dict], None]) -> None:
        import ipywidgets as widgets

        from magics.panel.controls import LABEL, checkbox, field_layout, tip

        self.fields: dict[str, Any] = {}
        for option in table_rows():
            value = _shown(form, option)
            if option.kind is bool:
                field = checkbox(bool(value), label(option), option.help)
            elif option.choices:
                field = widgets.Dropdown(options=[("unset", ""), *((c, c) for c in option.choices)],
                                         value=value if value in option.choices else "",
                                         description=label(option), style=LABEL, layout=field_layout(),
                                         **tip(option.help))
            else:
                field = widgets.Text(value=value, description=label(option), style=LABEL,
                                     layout=field_layout(), placeholder=f"unset ({option.metavar or 'VALUE'})",
                                     **tip(option.help))
            field.observe(on_change, names="value")
            self.fields[option.name] = field
        self.box = widgets.VBox(list(self.fields.values()))

    def form(self) -> TableForm:
        """The values shown."""
        return {name: field.value for name, field in self.fields.items()}
