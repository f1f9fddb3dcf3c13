"""Widgets the panel's forms share: the label column and a row of buttons choosing one value.

Only keywords that ipywidgets 7.7.1 (Colab's) and 8 both take.
"""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import traitlets

LABEL_WIDTH = "150px"
LABEL = {"description_width": LABEL_WIDTH}  # every field's ``style``: one label column
FIELD_WIDTH = "420px"  # a field with its label: room for the longest choice (TRANSFORMER_BASED_WRAP)


def field_layout() -> widgets.Layout:
    """Every field's ``layout``: one width, so no choice or placeholder is clipped."""
    return widgets.Layout(width=FIELD_WIDTH)


def checkbox(value: bool, description: str, tooltip: str = "") -> widgets.Checkbox:
    """A checkbox whose box sits in the control column, under the fields (its indent is the
    label column's width), its description to the right, as the other fields' values."""
    return widgets.Checkbox(value=value, description=description, indent=True, style=LABEL,
                            layout=field_layout(), **(tip(tooltip) if tooltip else {}))
# A field's hover text: ``tooltip`` from ipywidgets 8 (which deprecates the other name),
# ``description_tooltip`` before (7.7.1 ignores ``tooltip`` on a field, with a warning).
_TOOLTIP = "tooltip" if int(widgets.__version__.split(".")[0]) >= 8 else "description_tooltip"


def tip(text: str) -> dict[str, str]:
    """A field's (not a button's) tooltip keyword for this ipywidgets: ``Dropdown(..., **tip(t))``."""
    return {_TOOLTIP: text}


def row_label(text: str) -> widgets.HTML:
    """A label for a row of widgets that has no description of its own, drawn as the other
    fields' descriptions are (an empty HTML widget's own description: the same width, alignment
    and margin as theirs, where a plain ``Label`` is left-aligned and narrower)."""
    return widgets.HTML(value="", description=text, style=LABEL,
                        layout=widgets.Layout(width="auto"))


class ButtonChoice(widgets.HBox):
    """One of ``options`` (``(label, value)`` pairs) as a labelled row of toggle buttons: the
    chosen one is ``primary`` with a check icon, so it reads as chosen (a ``ToggleButtons``
    shows it in grey, like a disabled button).

    ``value`` is observable (``observe(fn, names="value")``); ``buttons`` maps each value to
    its ``ToggleButton`` (to disable one or change its tooltip). Pressing the chosen button
    again keeps it chosen.
    """

    value = traitlets.Unicode()

    def __init__(self, options: Sequence[tuple[str, str]], value: str, description: str,
                 tooltips: Sequence[str] = (), button_width: str | None = None) -> None:
        self.options = tuple((label, choice) for label, choice in options)
        tips = list(tooltips) + [""] * (len(self.options) - len(tooltips))
        layout = {"width": button_width} if button_width else {}
        self.buttons = {choice: widgets.ToggleButton(value=choice == value, description=label,
                                                     tooltip=tip, layout=widgets.Layout(**layout))
                        for (label, choice), tip in zip(self.options, tips, strict=True)}
        self.label = row_label(description)
        super().__init__([self.label, *self.buttons.values()])
        self.value = value
        self._show_choice()
        self.observe(lambda _: self._show_choice(), names="value")
        for button in self.buttons.values():
            button.observe(self._pressed, names="value")

    @traitlets.validate("value")
    def _valid(self, proposal: dict) -> str:
        if proposal["value"] not in self.buttons:
            valid = ", ".join(repr(v) for v in self.buttons)
            raise traitlets.TraitError(f"{proposal['value']!r} is not one of {valid}")
        return proposal["value"]

    def _pressed(self, change: dict) -> None:
        choice = next(v for v, b in self.buttons.items() if b is change["owner"])
        if change["new"]:
            self.value = choice
        elif choice == self.value:
            change["owner"].value = True  # un-pressing the chosen one keeps it chosen

    def _show_choice(self) -> None:
        for choice, button in self.buttons.items():
            chosen = choice == self.value
            button.value = chosen
            button.button_style = "primary" if chosen else ""
            button.icon = "check" if chosen else ""
