"""The supervisor at a scale where file descriptors pass 1023 (``select.select`` cannot take
them): 320 fake ranks on real sockets, each ending on one connection before its last line and
its result arrive on others, as a cluster's ranks do, so the supervisor waits for them."""

from __future__ import annotations

import io
import resource
import socket
import threading
import time

from notebook_accel import wire
from notebook_accel.launch.backends.base import WorkerHandle
from notebook_accel.launch.supervision.supervisor import Supervisor, WatchSettings
from notebook_accel.launch.views.output import OutputRelay
from notebook_accel.launch.views.record import LaunchRecord

RANKS = 320
CHANNELS = ("stdout", "stderr", "control", "events", "alive")


class _SocketRank(WorkerHandle):
    pid, exitcode, sentinel = 100, 0, -1
    terminate = kill = dump_stacks = lambda self: None
    reap = lambda self, timeout: None  # noqa: E731
    end_grace = 2.0

    def __init__(self, rank: int) -> None:
        self.rank = rank
        pairs = {name: socket.socketpair() for name in CHANNELS}
        self.kernel = {name: ours for name, (ours, _) in pairs.items()}
        self.worker = {name: theirs for name, (_, theirs) in pairs.items()}
        for sock in self.kernel.values():
            sock.setblocking(False)
        self.stdout_fd, self.stderr_fd = self.kernel["stdout"].fileno(), self.kernel["stderr"].fileno()
        self.control_fd, self.events_fd = self.kernel["control"].fileno(), self.kernel["events"].fileno()
        self.sentinel = self.kernel["alive"].fileno()

    def close(self) -> None:
        for sock in (*self.kernel.values(), *self.worker.values()):
            sock.close()


def _ranks_end(handles: list[_SocketRank]) -> None:
    """Every rank: its end first, then (0.1 s later) its last line and its result."""
    time.sleep(0.3)
    for handle in handles:
        handle.worker["alive"].close()
    time.sleep(0.1)
    for handle in handles:
        handle.worker["stdout"].sendall(b"epoch 1 done\n")
        wire.send(handle.worker["control"].fileno(), wire.Result(None))
        for name in ("stdout", "stderr", "control", "events"):
            handle.worker[name].close()


def test_320_ranks_with_fds_past_1023_are_supervised_to_the_end():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = RANKS * len(CHANNELS) * 2 + 200
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, needed), hard))
    handles = [_SocketRank(rank) for rank in range(RANKS)]
    try:
        assert max(h.sentinel for h in handles) >= 1024  # where select.select raised ValueError
        record = LaunchRecord(world_size=RANKS, num_processes=RANKS, device_type="cpu",
                              start_method="fork", mixed_precision="no")
        out = io.StringIO()
        relay = OutputRelay(stdout=out, stderr=io.StringIO())

        class NoView:
            holds_output = False

            def update(self, record, final=False):
                pass

        threading.Thread(target=_ranks_end, args=(handles,), daemon=True).start()
        workers = Supervisor(handles, relay, record, NoView(), WatchSettings(timeout=30.0)).run()
        assert all(w.returned for w in workers)
        assert record.outcome == "finished"
        assert out.getvalue() == f"[ranks 0-{RANKS - 1}] epoch 1 done\n"  # one line, deduplicated
        assert record.logs(RANKS - 1) == "epoch 1 done"
    finally:
        for handle in handles:
            handle.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
