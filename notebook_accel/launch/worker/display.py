"""In a worker: rich output goes to the kernel through our pipe, never through a kernel socket.

A worker forked from a kernel inherits the kernel's IPython shell, its ZMQ
sockets (not fork-safe) and ipykernel's trick of forwarding a child's output
over them. Here the worker is cut off from all of that:

- displays (``display(...)``, matplotlib's inline ``plt.show()``) of the main
  process are sent to the kernel, which shows them in the launching cell; other
  ranks print their ``text/plain`` (relayed, or not, as ``output=`` says), unless
  it is only a default repr (``<IPython.core.display.HTML object>``): such displays
  are counted for the live view instead;
- ``tqdm.auto`` / ``tqdm.notebook`` bars report to the kernel's job bar (they
  would build ipywidgets that no frontend can reach);
- ipykernel's streams held by old references (a logger made in the notebook)
  write to the worker's own stdout/stderr; any other kernel message is dropped.

Spawned and forkserver workers have no shell; when the launching process is a
kernel, one is made (without history) the first time the user's code imports
IPython, so the same code shows the same output under every start method.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from notebook_accel import events
from notebook_accel.wire import Display, Kind

_WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
MAX_DISPLAY_BYTES = 16 << 20  # larger displays are sent as their text/plain only
_DEFAULT_REPR = re.compile(r"<[A-Za-z_][\w.]* object(?: at 0x[0-9a-fA-F]+)?>")

Send = Callable[[Display], None]


def install(send: Send, main: bool, rich: bool) -> None:
    """Route this worker's displays and progress bars; cut it off from the kernel's sockets.

    Args:
        send: sends one display message to the kernel (on the control channel).
        main: this is the job's main process (rank 0): its displays are shown rich.
        rich: the launching process is a notebook kernel that shows rich output.
    """
    _cut_off_kernel()
    publisher = _publisher_factory(send, main and rich)
    shell = _existing_shell()
    if shell is not None:
        shell.display_pub = publisher(shell)
        sys.displayhook = sys.__displayhook__
    patches: dict[str, Callable[[Any], None]] = {
        "tqdm.notebook": lambda module: _report_to_kernel(module.tqdm_notebook),
        "tqdm.auto": lambda module: _report_to_kernel(module.tqdm),
    }
    if shell is None and rich:
        patches["IPython"] = lambda module: _make_shell(publisher)
    _after_import(patches)


def _existing_shell() -> Any:
    if "IPython" not in sys.modules:
        return None
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance() if InteractiveShell.initialized() else None


def _make_shell(publisher: Callable[[Any], Any]) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    if InteractiveShell.initialized():
        return
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    shell.display_pub = publisher(shell)


def _publisher_factory(send: Send, rich: bool) -> Callable[[Any], Any]:
    def make(shell: Any) -> Any:
        from IPython.core.displaypub import DisplayPublisher

        class RelayPublisher(DisplayPublisher):
            """Displays go to the kernel (main process) or to stdout as text (other ranks)."""

            def publish(self, data: dict, metadata: dict | None = None, source: Any = None,
                        *, transient: dict | None = None, update: bool = False,
                        **kwargs: Any) -> None:
                data = {mime: value for mime, value in data.items() if mime != _WIDGET_MIME}
                if not rich:
                    _print_text(data.get("text/plain"), update)
                    return
                if _size(data) > MAX_DISPLAY_BYTES:
                    data = {"text/plain": data.get("text/plain", "(a display too large to show)")}
                    metadata = {}
                sys.stdout.flush()  # what was printed before the display shows before it
                send(Display(data, metadata or {}, transient or {}, bool(update)))

            def clear_output(self, wait: bool = False) -> None:
                """Ignored: it would wipe the whole cell (other ranks' output, the live view)."""

        return RelayPublisher(shell=shell)

    return make


def _print_text(text: str | None, update: bool) -> None:
    """Print a display's text form; one that is only a default repr is counted instead
    (an update of a display id is no new output)."""
    if not text:
        return
    if _DEFAULT_REPR.fullmatch(text.strip()):
        if not update:
            events.emit(Kind.RICH_HIDDEN, {"count": 1})
        return
    print(text, flush=True)


def _size(data: dict) -> int:
    return sum(len(value) if isinstance(value, (str, bytes)) else 0 for value in data.values())


def _report_to_kernel(bar_class: type) -> None:
    """Make ``bar_class(...)`` build our event bar, which the kernel draws as the job bar.

    ``__new__`` returning an object that is not a ``bar_class`` skips its
    ``__init__``, so references to the class made before (a notebook's global
    ``tqdm``, inherited by fork) get the event bar too.
    """
    from notebook_accel.observe.progress import EventTqdm

    def new(cls: type, *args: Any, **kwargs: Any) -> EventTqdm:
        kwargs.pop("display", None)  # tqdm.notebook's own argument
        return EventTqdm(*args, **kwargs)

    bar_class.__new__ = new  # type: ignore[method-assign]


def _cut_off_kernel() -> None:
    """Drop every kernel message this process would send; streams write to our fds."""
    session = sys.modules.get("jupyter_client.session")
    if session is not None:
        session.Session.send = _dropped
    iostream = sys.modules.get("ipykernel.iostream")
    if iostream is not None:
        iostream.IOPubThread.send_multipart = _dropped
        iostream.IOPubThread._really_send = _dropped  # noqa: SLF001
        iostream.OutStream.write = _write_to_own_fd
        iostream.OutStream.flush = _no_flush
        iostream.OutStream.fileno = lambda self: 1 if self.name == "stdout" else 2


def _dropped(*args: Any, **kwargs: Any) -> None:
    return None


def _no_flush(self: Any) -> None:
    return None


def _write_to_own_fd(self: Any, text: str) -> int:
    fd = 1 if getattr(self, "name", "stdout") == "stdout" else 2
    os.write(fd, text.encode("utf-8", "backslashreplace"))
    return len(text)


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs a patch on a module right after it is first imported."""

    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self.patches = patches
        self.loaders: dict[str, importlib.abc.Loader] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                self.loaders[name] = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loaders[spec.name].create_module(spec)

    def exec_module(self, module: Any) -> None:
        name = module.__spec__.name
        self.loaders[name].exec_module(module)
        module.__spec__.loader = self.loaders[name]
        self.patches.pop(name)(module)


def _after_import(patches: dict[str, Callable[[Any], None]]) -> None:
    """Apply each patch now if its module is imported, else right after its import."""
    later = {}
    for name, patch in patches.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
        else:
            later[name] = patch
    if later:
        sys.meta_path.insert(0, _PatchOnImport(later))
