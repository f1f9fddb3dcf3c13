"""The ray:// relay's two ends in one process, over real sockets, with Ray's calls made directly:
bytes and ends of file travel both ways unchanged, the relay's buffer stays bounded while the
kernel does not read, pushes that arrive out of order are written in order, and a kernel that
stops beating has its ranks' channels closed."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from notebook_accel.launch.cluster.channel_relay import ChannelRelay, RelayedChannels
from notebook_accel.launch.worker.hub.hub_link import HELLO

# the relay is generic in its peers' channels: these tests give each peer several (the first
# one's end is told last), as a hub's one link is the simplest case of it
CHANNELS = ("alive", "stdout", "stderr", "control", "events", "commands")


def hello(token: bytes, rank: int, channel: str) -> bytes:
    return HELLO.pack(token, rank, CHANNELS.index(channel))


class _Call:
    def __init__(self, method):
        self.remote = method  # the call runs at once; its "reference" is its value


class _Handle:
    """A ChannelRelay as the kernel holds it: ``relay.method.remote(...)``; ``beats=False``: the
    kernel's beats never arrive (it died)."""

    def __init__(self, relay: ChannelRelay, beats: bool = True) -> None:
        self.relay, self.beats = relay, beats

    def __getattr__(self, name):
        if name == "beat" and not self.beats:
            return _Call(lambda key: None)
        return _Call(getattr(self.relay, name))


class _Ray:
    @staticmethod
    def get(ref):
        return ref

    @staticmethod
    def wait(refs, timeout=None):
        return refs, []


def _open(world_size: int = 1, silence: float = 10.0, beats: bool = True):
    """The relay, the kernel's end, its channels and each rank's worker-side sockets."""
    relay = ChannelRelay(host="127.0.0.1", silence=silence)
    kernel = RelayedChannels(_Ray, _Handle(relay, beats), world_size, CHANNELS)
    workers: dict[int, dict[str, socket.socket]] = {}

    def connect() -> None:
        for rank in range(world_size):
            for channel in CHANNELS:
                sock = socket.create_connection(kernel.address)
                sock.sendall(hello(kernel.token, rank, channel))
                workers.setdefault(rank, {})[channel] = sock

    connecting = threading.Thread(target=connect)
    connecting.start()
    channels = kernel.accept(time.monotonic() + 10, lambda: None)
    connecting.join()
    for by_name in channels.values():
        for sock in by_name.values():
            sock.setblocking(True)
    return relay, kernel, channels, workers


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"end of file after {len(data)} of {size} bytes"
        data += chunk
    return data


def test_bytes_and_ends_of_file_travel_both_ways_and_the_session_ends_with_the_channels():
    relay, pumps, channels, workers = _open()
    kernel, worker = channels[0], workers[0]
    payload = bytes(range(256)) * 12_000  # 3 MiB: several pulls
    threading.Thread(target=worker["stdout"].sendall, args=(payload,)).start()
    assert _read(kernel["stdout"], len(payload)) == payload
    kernel["commands"].sendall(b"run this")
    assert _read(worker["commands"], 8) == b"run this"
    kernel["alive"].shutdown(socket.SHUT_WR)  # a kill: the worker's watchdog sees the end
    worker["alive"].settimeout(5)
    assert worker["alive"].recv(1) == b""
    worker["stderr"].close()  # the rank is gone: its channel ends in the kernel
    kernel["stderr"].settimeout(5)
    assert kernel["stderr"].recv(1) == b""
    assert relay.sessions() == 1
    for sock in kernel.values():
        sock.close()
    deadline = time.monotonic() + 5
    while (relay.sessions() or any(s.fileno() >= 0 for s in pumps._pumps)) and (
            time.monotonic() < deadline):
        time.sleep(0.05)
    assert relay.sessions() == 0
    assert all(sock.fileno() == -1 for sock in pumps._pumps)  # the kernel keeps no socket


def test_a_rank_ends_in_the_kernel_after_its_result_and_output_arrived():
    """The supervisor reads a rank's result when its *alive* channel ends: that end comes last,
    even when the relay reads it first."""
    relay, _, channels, workers = _open()
    result = b"r" * 50_000  # within a socket pair's buffer: the test reads it only at the end
    workers[0]["alive"].close()  # the relay sees the end first...
    time.sleep(0.2)
    workers[0]["control"].sendall(result)  # ...then the result and the other channels' ends
    for name in ("stdout", "stderr", "control", "events", "commands"):
        workers[0][name].close()
    kernel = channels[0]
    kernel["alive"].settimeout(5)
    assert kernel["alive"].recv(1) == b""
    kernel["control"].setblocking(False)
    got = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := kernel["control"].recv(1 << 20):
            got += chunk
    assert got == result  # all of it was there when the rank ended
    for sock in kernel.values():
        sock.close()


def test_pushes_that_arrive_out_of_order_are_written_in_order():
    relay = ChannelRelay(host="127.0.0.1")
    key, address, token = relay.open(1, CHANNELS)
    workers = {}
    for channel in CHANNELS:
        workers[channel] = socket.create_connection(address)
        workers[channel].sendall(hello(token, 0, channel))
    assert relay.accept(key, 10) is None
    commands = CHANNELS.index("commands")
    late = threading.Thread(target=relay.push, args=(key, 1, 0, commands, b"second"))
    late.start()  # numbered after the first: waits for it
    time.sleep(0.2)
    relay.push(key, 0, 0, commands, b"first ")
    late.join(5)
    assert _read(workers["commands"], 12) == b"first second"
    relay.close(key)
    assert relay.sessions() == 0
    for sock in workers.values():
        sock.close()
