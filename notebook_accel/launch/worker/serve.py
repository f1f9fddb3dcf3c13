"""A warm pool's worker: serve runs from the kernel until it closes the commands channel.

Each :class:`~notebook_accel.wire.Run` is executed as a one-off worker executes its
payload (same outcome messages), with the function bound to this rank's namespace
(:mod:`.namespace`); then a :class:`~notebook_accel.wire.RunDone` tells the kernel the
run is over and whether the process group can still be trusted.

SIGINT (how the kernel stops a run) raises KeyboardInterrupt only while a run is in
progress; an interrupt that arrives after the run ended is ignored. The commands channel's
reader (:class:`.stop_cut.Commands`: the main thread between runs, a thread of its own
during them) also answers stack requests (:mod:`.live_stack`) and feeds the debugger's
prompt (:mod:`.debugger`: ``breakpoint()``, a post-mortem).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import signal
import threading
import traceback

from notebook_accel import wire
from notebook_accel.launch.worker import debugger, namespace, stop_cut
from notebook_accel.launch.worker.collectives import default_count
from notebook_accel.launch.worker.live_stack import main_stack
from notebook_accel.launch.worker.main import (
    WorkerPipes,
    WorkerSpec,
    execute,
    failure_record,
    flush_output,
    send,
    setup,
)
from notebook_accel.wire import FailureRecord, InputLine, Run, RunDone, StackAsk

_LAST_FRAME = re.compile(r'File "([^"]+)"')


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
    signal.signal(signal.SIGINT, stop_cut.on_sigint)
    # a rank forked by a cluster's agent (a Ray actor's thread) inherits that thread's blocked
    # signals: the stop button must reach this one
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    main = threading.main_thread().ident
    answer = functools.partial(send, pipes)
    debugger.install(answer)  # breakpoint(): a prompt in the notebook
    commands = stop_cut.Commands(pipes.commands.fileno(), answer, {
        StackAsk: lambda asked: answer(main_stack(main, asked.ask, asked.recorder,
                                                       asked.recorder_lines)),
        InputLine: debugger.feed})
    while True:
        message = commands.next()
        if message is None:  # the pool is closing
            return 0
        if type(message) is Run:
            _serve_run(spec, pipes, message)


def _serve_run(spec: WorkerSpec, pipes: WorkerPipes, run: Run) -> None:
    stop_cut.begin_run()
    try:
        try:
            _, outcome = execute(dataclasses.replace(spec, send_result=run.send_result),
                                 run.payload, bind=namespace.bind)
        finally:
            stop_cut.end_run()
    except KeyboardInterrupt as exc:  # between the function's end and the line above
        outcome = failure_record(spec, exc, 1)
    flush_output()
    at_cut = type(outcome) is FailureRecord and outcome.exc_type == stop_cut.CutInterrupt.__name__
    if at_cut:  # the stop button, at the point every rank agreed on: the group is whole
        outcome = dataclasses.replace(outcome, exc_type="KeyboardInterrupt",
                                      headline="KeyboardInterrupt")
    living = namespace.names()
    send(pipes, outcome, RunDone(collectives=default_count(),
                                 broke_group=not at_cut and _broke_group(outcome),
                                 names=living, copies=namespace.copies(),
                                 imported=namespace.imported(living)))


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
