"""A warm pool's worker: serve runs from the kernel until it closes the commands channel.

Each :class:`~notebook_accel.wire.Run` is executed as a one-off worker executes its
payload (same outcome messages), with the function bound to this rank's namespace
(:mod:`.namespace`); then a :class:`~notebook_accel.wire.RunDone` tells the kernel the
run is over and whether the process group can still be trusted.

SIGINT (how the kernel stops a run) raises KeyboardInterrupt only while a run is in
progress; an interrupt that arrives after the run ended is ignored.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
import traceback

from notebook_accel import wire
from notebook_accel.launch.worker import namespace
from notebook_accel.launch.worker.main import (
    WorkerPipes,
    WorkerSpec,
    execute,
    failure_record,
    flush_output,
    send,
    setup,
)
from notebook_accel.wire import FailureRecord, Run, RunDone

_running = False
_LAST_FRAME = re.compile(r'File "([^"]+)"')


def _on_sigint(signum: int, frame: object) -> None:
    if _running:
        raise KeyboardInterrupt


def serve_main(spec: WorkerSpec, payload: None, pipes: WorkerPipes) -> None:
    """Entry point of a pool worker process (as ``worker_main``'s); never returns."""
    code = 1
    try:
        setup(spec, pipes)
        code = serve(spec, pipes)
    except BaseException:  # noqa: BLE001 - a broken setup is still reported as output
        traceback.print_exc()
    finally:
        flush_output()
        os._exit(code)


def serve(spec: WorkerSpec, pipes: WorkerPipes) -> int:
    """Run what the kernel sends until it closes the commands channel; returns the exit code."""
    signal.signal(signal.SIGINT, _on_sigint)
    fd = pipes.commands.fileno()
    while True:
        try:
            message = wire.receive(fd)
        except OSError:
            return 0
        if message is None:  # the pool is closing
            return 0
        if type(message) is Run:
            _serve_run(spec, pipes, message)


def _serve_run(spec: WorkerSpec, pipes: WorkerPipes, run: Run) -> None:
    global _running
    _running = True
    try:
        try:
            _, outcome = execute(dataclasses.replace(spec, send_result=run.send_result),
                                 run.payload, bind=namespace.bind)
        finally:
            _running = False
    except KeyboardInterrupt as exc:  # between the function's end and the line above
        outcome = failure_record(spec, exc, 1)
    flush_output()
    send(pipes, outcome, RunDone(collectives=_collectives(), broke_group=_broke_group(outcome),
                                 names=namespace.names(), copies=namespace.copies(),
                                 imported=namespace.imported()))


def join_process_group() -> None:
    """Run on every rank when a pool starts: the process group is ready for the first run."""
    from notebook_accel.runtime.state import PartialState

    PartialState()


def _broke_group(outcome: wire.Result | FailureRecord) -> bool:
    """The run failed inside torch.distributed (an interrupted or broken collective)."""
    if type(outcome) is not FailureRecord:
        return False
    frames = _LAST_FRAME.findall(outcome.traceback)
    return outcome.secondary or bool(frames and "torch/distributed" in frames[-1])


def _collectives() -> int | None:
    """How many collectives the default process group has issued (None: no group; -1: a
    group whose count cannot be read)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    try:
        import torch

        group = dist.distributed_c10d._get_default_group()
        for device in ("cpu", "cuda"):
            try:
                backend = group._get_backend(torch.device(device))
            except RuntimeError:
                continue
            return int(backend._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - unknown: the kernel then distrusts the group after a failure
        return -1
    return -1
