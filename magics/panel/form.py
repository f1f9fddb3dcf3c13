"""The config panel (``%accelerate config``, ``magics.panel.config_panel()``): ipywidgets
in place of the peer's terminal wizard.

The widgets only mirror a :class:`~magics.panel.state.FormState`; the rules live in
:mod:`magics.panel.rules` and :mod:`magics.panel.state`, the Test button's runner in
:mod:`magics.panel.sanity`.
"""

from __future__ import annotations

import html
import os
import warnings
from pathlib import Path

import ipywidgets as widgets

from magics import config_hint
from magics.panel.controls import LABEL, ButtonChoice, field_layout, tip
from magics.panel.deepspeed import DeepSpeedFields
from magics.panel.fsdp import FsdpFields
from magics.panel.own_fields import field_row
from magics.panel.rules import (
    START_METHOD_TIPS,
    Choice,
    compile_backend_choices,
    device_choices,
    effective_device,
    max_processes,
    precision_choices,
)
from magics.panel.sanity import run_sanity
from magics.panel.state import (
    BLOCKING,
    MULTI_NODE_PORT,
    FormState,
    Message,
    config_from_state,
    launcher_call,
    magic_line,
    saved_device,
    state_from_config,
    validate,
)
from magics.panel.table_options import TableFields
from notebook_accel.config import (
    ENV_OPTIONS,
    LaunchConfig,
    default_config_path,
    load_config,
    save_config,
)
from notebook_accel.machine.hardware import Hardware, detect

# "Show as code": a code block in the front end's code font (JupyterLab's variables, else monospace).
_CODE_STYLE = ("font-family:var(--jp-code-font-family,monospace),monospace;"
               "font-size:var(--jp-code-font-size,13px);line-height:var(--jp-code-line-height,1.4);"
               "background:var(--jp-cell-editor-background,#f5f5f5);"
               "border:1px solid var(--jp-border-color2,#e0e0e0);padding:6px 8px;margin:4px 0;"
               "white-space:pre;overflow-x:auto;user-select:text")


def _int_field(description: str, value: int, low: int, high: int,
               tooltip: str) -> widgets.BoundedIntText:
    return widgets.BoundedIntText(value=value, min=low, max=high, description=description,
                                  style=LABEL, layout=field_layout(), **tip(tooltip))


_COLOUR = {"error": "#c62828", "needed": "#555", "note": "#8a6d00"}
_LABEL = {"error": "Error:", "needed": "To do:", "note": "Note:"}  # words: icon glyphs may be missing
_BESIDE = ("device", "num_processes", "start_method", "dynamo_backend")  # fields with notes beside


def _message_html(level: str, text: str) -> str:
    return (f"<div style='color:{_COLOUR[level]}'><b>{_LABEL[level]}</b> "
            f"{html.escape(text)}</div>")


def _beside(field: widgets.Widget, note: widgets.HTML) -> widgets.HBox:
    """A field and its note to its right (the note wraps; it never pushes the form down)."""
    note.layout = widgets.Layout(margin="0 0 0 12px", max_width="440px")
    return widgets.HBox([field, note])


def _options(choices: list[Choice], current: str) -> list[tuple[str, str]]:
    """A dropdown's ``(label, value)`` options: the enabled choices, and ``current`` even when it
    is not (a file's value is shown as it is, marked, not replaced)."""
    return [(c.value if c.enabled else f"{c.value} (not available here)", c.value)
            for c in choices if c.enabled or c.value == current]


def _load(config_file: str | os.PathLike[str] | None) -> tuple[LaunchConfig, list[str]]:
    """The file's config and the lines to show about it (never raises: a bad file is reported)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cfg = load_config(config_file)
        except FileNotFoundError:
            return LaunchConfig(), [f"Config file: {config_file} does not exist yet; Save creates it"]
        except ValueError as err:
            return LaunchConfig(), [f"Could not read the config file ({err}); showing defaults"]
    if cfg.source is None:
        notes = [f"Config file: none yet; Save writes {default_config_path()}"]
    else:
        notes = [f"Config file: {cfg.source} (loaded)"]
    notes += [str(w.message) for w in caught]
    for option, var in ENV_OPTIONS.items():
        if os.environ.get(var):
            notes.append(f"{var}={os.environ[var]} is set: it overrides the file's {option}")
    return cfg, notes


class ConfigPanel(widgets.VBox):
    """The panel: a form over the launch config with Save, Copy as code and Test.

    Attributes for scripted use (and tests): ``device``, ``num_processes``, ``precision`` (a
    ``controls.ButtonChoice``: its ``value``) with ``precision_buttons`` (value -> ToggleButton),
    ``dynamo_backend``, ``start_method``, ``num_machines``,
    ``machine_rank``, ``main_process_ip``, ``main_process_port``, ``strategy`` (a
    ``panel_fsdp.FsdpFields``: the strategy selector and FSDP's options), ``deepspeed`` (a
    ``panel_deepspeed.DeepSpeedFields``), ``table`` (a ``table_options.TableFields``: the
    launch options table's other rows, ``table.fields[name]``: ``snapshot_every``,
    ``snapshot_dir``, ``heal``...), ``save_button``,
    ``code_button``, ``test_button``, ``messages``, ``status``, ``code``, ``test_output``.
    """

    def __init__(self, config_file: str | os.PathLike[str] | None = None,
                 hardware: Hardware | None = None) -> None:
        self.hardware = hardware or detect()
        self.path = Path(config_file).expanduser() if config_file else default_config_path()
        self._base, notes = _load(config_file)
        state = state_from_config(self._base, self.hardware)
        bound = max_processes(state.device, self.hardware)
        if state.num_processes > bound:
            notes.append(f"The file asks for {state.num_processes} processes; at most {bound} "
                         f"here ({self.hardware.summary()}): showing {bound}")
            state.num_processes = bound
        self._build_fields(state)
        self._build_buttons()
        self.notes = widgets.HTML("<br>".join(html.escape(n) for n in notes))
        header = [widgets.HTML(f"<b>notebook_accel launch config</b> &nbsp; Hardware: "
                               f"{html.escape(self.hardware.summary())}"), self.notes]
        super().__init__(header + self._rows())
        self.add_class("notebook-accel-config-panel")
        self._refresh()

    def _build_fields(self, state: FormState) -> None:
        hw = self.hardware
        devices = device_choices(hw)
        self.device = widgets.Dropdown(
            options=[(c.value if c.enabled else f"{c.value} (not detected)", c.value)
                     for c in devices if c.enabled or c.value == state.device],
            value=state.device, description="Device", style=LABEL, layout=field_layout(),
            **tip("; ".join(f"{c.value}: {c.tooltip}" for c in devices)))
        self.num_processes = widgets.IntText(  # not Bounded: it would clamp without a word
            value=state.num_processes, description="Processes",
            **tip(field_row("num_processes").help),
            style=LABEL, layout=field_layout())
        self.field_notes = {name: widgets.HTML() for name in _BESIDE}  # shown beside the field
        self.clamp_note = self.field_notes["num_processes"]  # (a clamp is said there too)
        self._clamped: tuple[int, int] | None = None  # (asked, kept) of the last clamp
        self.precision = ButtonChoice([(c.value, c.value) for c in precision_choices(state.device, hw)],
                                      state.mixed_precision, "Mixed precision", button_width="80px")
        self.precision_buttons = self.precision.buttons
        self.precision_note = widgets.HTML()
        self.start_method = widgets.Dropdown(
            options=list(field_row("start_method").choices), value=state.start_method, description="Start method",
            style=LABEL, layout=field_layout(),
            **tip("; ".join(f"{k}: {v}" for k, v in START_METHOD_TIPS.items())))
        self.dynamo_backend = widgets.Dropdown(  # only what runs here (and the file's value)
            options=_options(compile_backend_choices(state.device, hw), state.dynamo_backend),
            value=state.dynamo_backend, description="torch.compile", style=LABEL, layout=field_layout(),
            **tip(field_row("dynamo_backend").help))
        self._syncing = False  # set while the panel itself rewrites a field's options
        self.num_machines = _int_field("Machines", state.num_machines, 1, 4096,
                                       f"{field_row('num_machines').help}; more than 1 shows their "
                                       "settings")
        self.machine_rank = _int_field("Machine rank", state.machine_rank, 0, 4095,
                                       f"{field_row('machine_rank').help}, 1.. on the others")
        self.main_process_ip = widgets.Text(
            value=state.main_process_ip, description="Main process IP", style=LABEL,
            layout=field_layout(), placeholder="address of machine 0", **tip(field_row("main_process_ip").help))
        self.main_process_port = _int_field("Main process port", state.main_process_port, 0, 65535,
                                            f"{field_row('main_process_port').help}; the same port "
                                            "on every machine; 0: unset")
        self.multi_node = widgets.VBox([self.machine_rank, self.main_process_ip,
                                        self.main_process_port])
        self.strategy = FsdpFields(state.fsdp, self._on_change)
        self.deepspeed = DeepSpeedFields(state.deepspeed, self._on_change)
        self.table = TableFields(state.options, self._on_change)  # the table's other rows
        for w in (self.device, self.num_processes, self.precision, self.start_method,
                  self.dynamo_backend, self.num_machines, self.machine_rank, self.main_process_ip,
                  self.main_process_port):
            w.observe(self._on_change, names="value")

    def _build_buttons(self) -> None:
        self.messages = widgets.HTML()
        self.saved = widgets.HTML()  # Save's outcome; ``status`` is the Test's
        self.save_button = widgets.Button(description="Save", button_style="primary",
                                          icon="save", tooltip=f"write {self.path}")
        self.code_button = widgets.Button(description="Show as code", icon="code",
                                          tooltip="show the equivalent notebook_launcher(...) "
                                                  "call and %%accelerate line, to copy")
        self.test_button = widgets.Button(description="Test", icon="play",
                                          tooltip="run the sanity check on these settings")
        self.status = widgets.HTML()
        self.code = widgets.HTML(layout=widgets.Layout(display="none"))  # two <pre><code> boxes
        self.test_output = widgets.Output()
        self.save_button.on_click(lambda _: self.save())
        self.code_button.on_click(lambda _: self._show_code())
        self.test_button.on_click(lambda _: self.test())

    def _rows(self) -> list[widgets.Widget]:
        buttons = widgets.HBox([self.save_button, self.code_button, self.test_button])
        notes = self.field_notes
        return [_beside(self.device, notes["device"]), _beside(self.num_processes, notes["num_processes"]),
                self.precision, self.precision_note, _beside(self.start_method, notes["start_method"]),
                _beside(self.dynamo_backend, notes["dynamo_backend"]), self.num_machines, self.multi_node,
                self.strategy.box, self.deepspeed.box, self.table.box, self.messages, buttons, self.saved, self.code,
                self.status, self.test_output]  # the Test's verdict right above its log

    def __repr__(self) -> str:
        """The panel as text (instead of every child), what a front end shows where widgets do
        not render: where it saves, and how to configure from a terminal instead."""
        return f"notebook_accel config panel ({config_hint.SHORT}); file: {self.path}\n" + \
            config_hint.TERMINAL

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        """ipywidgets 8's bundle, with the whole text (it cuts ``text/plain`` at 110 characters)."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/plain"] = repr(self)
        return bundle

    @property
    def mixed_precision(self) -> str:
        """The chosen mixed-precision button's value."""
        return self.precision.value

    def state(self) -> FormState:
        """The form's current values."""
        return FormState(
            device=self.device.value, num_processes=self.num_processes.value,
            mixed_precision=self.mixed_precision, start_method=self.start_method.value,
            dynamo_backend=self.dynamo_backend.value, num_machines=self.num_machines.value, machine_rank=self.machine_rank.value,
            main_process_ip=self.main_process_ip.value,
            main_process_port=self.main_process_port.value, fsdp=self.strategy.form(),
            deepspeed=self.deepspeed.form(), options=self.table.form())

    def _on_change(self, change: dict) -> None:
        if not self._syncing:
            self._refresh()

    def _refresh(self) -> None:
        """Re-derive enabled choices, bounds, visibility and messages from the form."""
        hw, state = self.hardware, self.state()
        self._clamp_processes(max_processes(state.device, hw))
        self._offer_port()
        tips = []
        for choice in precision_choices(state.device, hw):
            button = self.precision_buttons[choice.value]
            button.disabled, button.tooltip = not choice.enabled, choice.tooltip
            if not choice.enabled:
                tips.append(f"{choice.value}: {choice.tooltip}")
        self.precision_note.value = "<small>" + "<br>".join(html.escape(t) for t in tips) + "</small>"
        self._offer_backends(compile_backend_choices(state.device, hw))
        self.multi_node.layout.display = "" if state.num_machines > 1 else "none"
        self.strategy.refresh()
        self.deepspeed.refresh(state.strategy)
        messages = validate(self.state(), hw)
        self._show_messages(messages)
        self.save_button.disabled = any(m.level in BLOCKING for m in messages)
        self.test_button.disabled = self.save_button.disabled
        if self.code.layout.display != "none":
            self._show_code()

    def _show_messages(self, messages: list[Message]) -> None:
        """A field's notes beside the field (a clamp first); errors, and what is still needed,
        above the buttons."""
        beside = {name: [] for name in self.field_notes}
        if self._clamped is not None and self._clamped[1] == self.num_processes.value:
            asked, kept = self._clamped
            beside["num_processes"].append(_message_html(
                "note", f"Processes {asked} changed to {kept}: at most {kept} on "
                        f"{effective_device(self.device.value, self.hardware)} here "
                        f"({self.hardware.summary()})"))
        below = []
        for m in messages:
            if m.level == "note" and m.field in beside:
                beside[m.field].append(_message_html(m.level, m.text))
            else:
                below.append(_message_html(m.level, m.text))
        for name, note in self.field_notes.items():
            note.value = "".join(beside[name])
        self.messages.value = "".join(below)

    def _offer_port(self) -> None:
        """Several machines need one port on all: offer torchrun's default rather than 0 (unset)."""
        if self.num_machines.value > 1 and self.main_process_port.value == 0:
            self.main_process_port.value = MULTI_NODE_PORT  # re-enters _refresh through the observer

    def _offer_backends(self, choices: list[Choice]) -> None:
        """The torch.compile dropdown offers what runs on the chosen device (cudagraphs: CUDA);
        its value stays (marked when it cannot run here: ``validate`` says why)."""
        dropdown = self.dynamo_backend
        options = _options(choices, dropdown.value)
        if list(dropdown.options) != options:
            value, self._syncing = dropdown.value, True
            try:  # a new options list selects its first entry: put the value back, quietly
                dropdown.options, dropdown.value = options, value
            finally:
                self._syncing = False

    def _clamp_processes(self, bound: int) -> None:
        """Keep Processes at most ``bound``, saying so beside it; below 1 it is refused (an
        error), never changed without a word."""
        asked = self.num_processes.value
        if asked <= bound:
            if self._clamped is not None and asked != self._clamped[1]:  # chosen again: stale
                self._clamped = None
            return
        self._clamped = (asked, bound)
        self.num_processes.value = bound  # re-enters _refresh through the observer

    def save(self) -> Path | None:
        """Write the form to the config file (the Save button); returns the path, or None when
        the form has errors (they are shown in the panel)."""
        if any(m.level in BLOCKING for m in validate(self.state(), self.hardware)):
            self.saved.value = "<span style='color:#c62828'>Not saved: fix the errors above</span>"
            return None
        try:
            path = save_config(config_from_state(self.state(), self._base, self.hardware), self.path)
        except (OSError, ValueError) as err:
            self.saved.value = f"<span style='color:#c62828'>Not saved: {html.escape(str(err))}</span>"
            return None
        self.saved.value = f"Saved to <code>{html.escape(str(path))}</code>"
        state = self.state()
        if state.device == "auto" and saved_device(state, self.hardware):
            self.saved.value += (
                html.escape(f" (device auto written as {saved_device(state, self.hardware)}, what "
                            "it is on this machine: with several processes the file names the "
                            "device, so that Accelerate's ")
                + "<code>accelerate launch</code> starts them all)")
        self.notes.value = html.escape(f"Config file: {path} (saved; every launch without "
                                       "arguments now uses it)")
        return path

    def _show_code(self) -> None:
        """Two boxes, each a valid cell alone: the Python call, and the cell magic's line."""
        state = self.state()
        boxes = [("In Python:", launcher_call(state, self.path)),
                 ("Or as the first line of a cell whose body is the training code:",
                  magic_line(state, self.path))]
        self.code.value = "".join(
            f"<div>{html.escape(title)}</div><pre style='{_CODE_STYLE}'>"
            f"<code style='font-family:inherit'>{html.escape(text)}</code></pre>"
            for title, text in boxes)
        self.code.layout.display = ""

    def test(self) -> bool | None:
        """Run the sanity check with the form's settings (the Test button), its output live
        in the panel; returns its verdict, or None when it could not run."""
        self.test_button.disabled = True
        try:
            return run_sanity(self.state(), self.hardware, self.status, self.test_output)
        finally:
            self.test_button.disabled = self.save_button.disabled


def config_panel(config_file: str | os.PathLike[str] | None = None,
                 hardware: Hardware | None = None) -> ConfigPanel:
    """The launch-config panel, showing the current file's values; display it (or make it a
    cell's last expression).

    Args:
        config_file: the file to load and save; default: the default config file
            (``$NOTEBOOK_ACCEL_CONFIG_FILE``, else ``~/.cache/notebook_accel/default_config.yaml``;
            Accelerate's file is loaded if ours does not exist yet, but never written).
        hardware: what to offer; default: :func:`notebook_accel.machine.hardware.detect` (never
            initialises CUDA in the kernel).
    Returns:
        The panel (an ``ipywidgets.VBox``).

    Example::

        from magics.panel import config_panel
        config_panel()
    """
    return ConfigPanel(config_file, hardware)
