"""The config panel's Test button: the sanity launch with the form's settings, output live."""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from magics.panel.rules import effective_device
from magics.panel.state import FormState
from notebook_accel.machine.hardware import Hardware, counted


class _LineWriter(io.TextIOBase):
    """A text stream that hands complete lines to ``emit`` (e.g. ``Output.append_stdout``)."""

    def __init__(self, emit: Callable[[str], Any]) -> None:
        super().__init__()
        self._emit = emit
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._partial += text
        if "\n" in self._partial:
            done, self._partial = self._partial.rsplit("\n", 1)
            self._emit(done + "\n")
        return len(text)

    def flush(self) -> None:
        if self._partial:
            self._emit(self._partial)
            self._partial = ""


def sanity_options(state: FormState, hw: Hardware) -> dict[str, Any]:
    """The launch options for the sanity check: the form's, on this machine only (one node,
    loopback), so neither the saved file nor its multi-node settings change what runs."""
    options: dict[str, Any] = {
        "num_processes": state.num_processes, "mixed_precision": state.mixed_precision,
        "start_method": state.start_method, "device": effective_device(state.device, hw),
        "num_nodes": 1, "node_rank": 0, "master_addr": "127.0.0.1",
    }
    if state.main_process_port and state.num_machines == 1:
        options["use_port"] = state.main_process_port
    return options


def _colour(text: str, colour: str) -> str:
    return f"<span style='color:{colour}'>{html.escape(text)}</span>"


def run_sanity(state: FormState, hw: Hardware, status: Any, output: Any) -> bool | None:
    """Run ``notebook_accel.cli.sanity.run_sanity_check`` with ``state``'s settings.

    ``status`` (an HTML widget) shows running / passed / failed; ``output`` (an
    ``ipywidgets.Output``) receives the workers' lines as they come. Returns the
    verdict, or None when the check could not run (missing module, interrupted).
    """
    try:
        from notebook_accel.cli.sanity import run_sanity_check
    except ModuleNotFoundError as err:
        if err.name != "notebook_accel.cli.sanity":
            raise
        status.value = _colour("Test unavailable: notebook_accel.cli.sanity is missing", "#c62828")
        return None
    options = sanity_options(state, hw)
    output.clear_output()
    device = options["device"]
    processes = counted(options["num_processes"], f"{device} process", f"{device} processes")
    status.value = (f"Running the sanity check on {processes}, "
                    f"mixed precision {options['mixed_precision']}…")
    out, err = _LineWriter(output.append_stdout), _LineWriter(output.append_stderr)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            passed = bool(run_sanity_check(**options))
    except KeyboardInterrupt:
        status.value = _colour("Test interrupted; every worker was stopped", "#8a6d00")
        return None
    except Exception as exc:  # noqa: BLE001 - shown in the panel, the kernel stays usable
        output.append_stderr(f"{type(exc).__name__}: {exc}\n")
        passed = False
    finally:
        out.flush()
        err.flush()
    status.value = (_colour("Test passed ✓", "#2e7d32") if passed
                    else _colour("Test failed ✗ (see the output below)", "#c62828"))
    return passed
