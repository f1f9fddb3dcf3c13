"""The XLA host worker: it starts one process per TPU chip through torch_xla's launcher.

The kernel starts this single *host* worker through the local-processes backend
(:mod:`notebook_accel.launch.backends.xla`), so output relay, ``WorkerError``,
interrupt and kernel-death handling all apply. :func:`run_cores` calls torch_xla's
own launcher (``torch_xla.launch``, PJRT), which starts the core processes as
torch_xla decides: one process per chip, or the host worker itself for
``num_processes=1``. Each core runs the user's function with the torchrun-style
environment taken from the XLA runtime; rank 0's return value (tensors on the CPU)
comes back through a file and is the host worker's own return value. Core
processes belong to the host worker's process group, so stopping the host
(failure elsewhere, interrupt, timeout, kernel death) stops them too.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from notebook_accel import wire
from notebook_accel.launch.handoff import environment as env
from notebook_accel.launch.handoff.payload import dumps_result, load_payload
from notebook_accel.launch.worker.main_module import main_module_hidden
from notebook_accel.machine.tpu import bf16_environment

# ---- the host worker ----------------------------------------------------------------------

def run_cores(payload: bytes, nprocs: int | None, return_all: bool, start_method: str,
              pjrt: str, output: str = "all") -> Any:
    """In the host worker: start the cores with torch_xla's launcher and collect their results.

    ``output``: ``"all"`` cores' output (each line after the first core's prefixed
    ``[core N] ``), or only core 0's (``"main"``, ``"none"``; the kernel filters the rest).

    Returns rank 0's value, or the list of every core's value with ``return_all``.
    """
    __tracebackhide__ = True  # a core's error is reported without this frame
    os.environ["PJRT_DEVICE"] = pjrt
    os.environ[env.DEVICE_TYPE] = "xla"
    os.environ.update(bf16_environment(os.environ.get(env.MIXED_PRECISION, "no")))
    import torch_xla

    with tempfile.TemporaryDirectory(prefix="notebook-accel-xla-") as results:
        try:
            with main_module_hidden(start_method == "spawn" and nprocs != 1):
                torch_xla.launch(_core_main, args=(payload, results, return_all, output),
                                 start_method=start_method, debug_single_process=nprocs == 1)
        except BaseException as exc:
            error = _user_facing(exc, _failures(Path(results)))
            error.__suppress_context__ = True
            raise error  # noqa: B904 - its cause, when any, is set by _user_facing
        files = sorted(Path(results).glob("result_*.pkl"), key=lambda p: int(p.stem[7:]))
        values = [pickle.loads(path.read_bytes()) for path in files]
    if return_all:
        return values
    return values[0] if values else None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class CoreTraceback(Exception):
    """The traceback of a core process, shown as the cause of the error it raised."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f"\n{self.text}"


def _user_facing(exc: BaseException, failures: list[wire.FailureRecord]) -> BaseException:
    """The error to report: the failing core's own, without torch_xla's launcher frames.

    Ran in this process (``num_processes=1``): the same exception, its traceback cut
    to the user's frames. Ran in a core process: the exception torch_xla passed
    back, caused by a :class:`CoreTraceback` of the earliest failing core. Several
    failures: a ``RuntimeError`` naming the earliest (the root cause).
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code is not _core_main.__code__:
        tb = tb.tb_next
    if tb is not None:  # raised in this very process
        return exc.with_traceback(tb.tb_next)
    if not failures:  # a core died without a Python exception (a signal), or an internal error
        return exc
    if len(failures) > 1:
        first = failures[0].headline.splitlines()[0]
        return RuntimeError(f"{first} ({len(failures) - 1} other core(s) failed after it)")
    error = exc.with_traceback(None)
    error.__cause__ = CoreTraceback(failures[0].traceback)
    return error


def _failures(results: Path) -> list[wire.FailureRecord]:
    """The failure records the cores left in ``results`` (``error_<rank>.msg``), earliest first."""
    records = [wire.decode(path.read_bytes()) for path in results.glob("error_*.msg")]
    return sorted(records, key=lambda record: (record.timestamp, record.rank))


# ---- each core ----------------------------------------------------------------------------

def _core_environment(ordinal: int, world: int, local: int, local_world: int) -> dict[str, str]:
    """The torchrun-style variables of one core process."""
    return {
        env.RANK: str(ordinal), env.WORLD_SIZE: str(world), env.LOCAL_RANK: str(local),
        env.LOCAL_WORLD_SIZE: str(local_world), env.GROUP_RANK: "0", env.DEVICE_TYPE: "xla",
    }


class LinePrefixer(io.TextIOBase):
    """A text stream that starts every line written to ``stream`` with ``prefix``."""

    def __init__(self, stream: Any, prefix: str) -> None:
        self.stream = stream
        self.prefix = prefix
        self._line_start = True

    def write(self, text: str) -> int:
        pieces = []
        for piece in text.splitlines(keepends=True):
            if self._line_start:
                pieces.append(self.prefix)
            pieces.append(piece)
            self._line_start = piece.endswith(("\n", "\r"))
        self.stream.write("".join(pieces))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True


def _route_output(ordinal: int, output: str) -> None:
    """Core 0 writes as the host worker; the others are prefixed, or silenced unless "all"."""
    if ordinal == 0:
        return
    if output != "all":
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        return
    sys.stdout = LinePrefixer(sys.stdout, f"[core {ordinal}] ")
    sys.stderr = LinePrefixer(sys.stderr, f"[core {ordinal}] ")


def _core_main(index: int, payload: bytes, results: str, return_all: bool,
               output: str = "all") -> None:
    """One core: set its environment, run the user's function, leave its result in ``results``."""
    from notebook_accel import events
    from notebook_accel.launch.worker.main import report_memory
    from notebook_accel.runtime import xla as runtime

    ordinal, world, local = runtime.ranks()
    if runtime.devices_per_process() == 1:  # TPU v2/v3 run 2 cores as threads: no per-core env
        os.environ.update(_core_environment(ordinal, world, local, world))
        _route_output(ordinal, output)
        if ordinal != 0:
            events.close()  # progress and metrics come from rank 0, as with our own workers
        elif world > 1:  # a core process of its own: its memory figure, as the host's would be
            report_memory("xla", local)
    try:
        function, args, kwargs = load_payload(payload)
        value = function(*args, **kwargs)
    except BaseException as exc:
        user_tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        record = wire.FailureRecord(
            rank=ordinal, pid=os.getpid(), exitcode=None, exc_type=type(exc).__name__,
            headline=f"XLA core {ordinal} failed: {_describe(exc)}",
            traceback="".join(traceback.format_exception(type(exc), exc, user_tb)),
        )
        Path(results, f"error_{ordinal}.msg").write_bytes(wire.encode(record))  # stamped now
        if world > 1 and hasattr(exc, "add_note"):
            exc.add_note(f"(raised on XLA core {ordinal} of {world})")
        raise
    if return_all or ordinal == 0:
        tmp = Path(results, f".result_{ordinal}.tmp")
        tmp.write_bytes(dumps_result(value))
        os.replace(tmp, Path(results, f"result_{ordinal}.pkl"))
