"""Fork a node's ranks as a local launch does: private pipes per channel, a kernel-alive pipe
(the watchdog), the parent-death signal; the worker side (:func:`.main.worker_main`,
:func:`.serve.serve_main`) and its wire are unchanged.

Used by the node hub (``node_hub.py``), whose process is the ranks' parent: it reads their
pipes, waits for their exits and signals them.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from multiprocessing.connection import Connection

from notebook_accel.launch.handoff.payload import Payload
from notebook_accel.launch.worker.hub.hub_link import OUTPUTS, Frame
from notebook_accel.launch.worker.main import WorkerPipes, WorkerSpec, enlarge_pipe, worker_main
from notebook_accel.launch.worker.serve import serve_main


@dataclass
class ForkedRank:
    """One rank as its hub holds it: its pid, the read ends of its channels, its commands."""

    rank: int
    pid: int
    outputs: dict[Frame, int]  # STDOUT, STDERR, CONTROL, EVENTS -> the hub's (read) end
    commands: int | None = None  # a pool worker's commands pipe (the hub's write end)


def fork_ranks(specs: list[WorkerSpec], payload: Payload | None,
               serve: bool) -> tuple[list[ForkedRank], int]:
    """Fork one worker per spec (``serve``: warm pool workers, with a commands pipe each);
    returns them and the write end of their kernel-alive pipe (closing it ends them all)."""
    alive_r, alive_w = os.pipe()
    forked: list[ForkedRank] = []
    try:
        for spec in specs:
            forked.append(_fork(spec, payload, serve, alive_r))
    except BaseException:
        os.close(alive_w)
        for rank in forked:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank.pid, 9)
        raise
    finally:
        os.close(alive_r)
    return forked, alive_w


def _fork(spec: WorkerSpec, payload: Payload | None, serve: bool, alive_r: int) -> ForkedRank:
    pipes = [os.pipe() for _ in OUTPUTS]
    commands = os.pipe() if serve else None
    enlarge_pipe(pipes[3][1])  # events
    if commands is not None:
        enlarge_pipe(commands[1])  # a pool's runs
    spec.parent_pid = os.getpid()
    pid = os.fork()
    if pid == 0:  # the worker: never returns
        try:
            keep = {w for _, w in pipes} | {alive_r} | ({commands[0]} if commands else set())
            _close_all_but(keep)
            worker_pipes = WorkerPipes(
                stdout=Connection(pipes[0][1], readable=False),
                stderr=Connection(pipes[1][1], readable=False),
                control=Connection(pipes[2][1], readable=False),
                events=Connection(pipes[3][1], readable=False),
                alive=Connection(alive_r, writable=False),
                commands=Connection(commands[0], writable=False) if commands else None)
        except BaseException:  # noqa: BLE001 - nothing to tell yet: the hub reports the exit
            os._exit(1)
        (serve_main if serve else worker_main)(spec, payload, worker_pipes)  # type: ignore[arg-type]
    for _, write_end in pipes:
        os.close(write_end)
    if commands is not None:
        os.close(commands[0])
    for read_end, _ in pipes:
        os.set_blocking(read_end, False)
    return ForkedRank(spec.rank, pid, {kind: r for kind, (r, _) in zip(OUTPUTS, pipes, strict=True)},
                      commands[1] if commands else None)


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor of this (just forked) process but ``keep``: the hub's, Ray's."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
