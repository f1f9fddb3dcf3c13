"""The ray:// relay's timings, in one process over real sockets: its buffer stays bounded while the
kernel does not read, and its silence clock (tests/unit/test_channel_relay.py has the rest)."""

from __future__ import annotations

import threading
import time

from notebook_accel.launch.cluster import channel_relay
from notebook_accel.launch.cluster.channel_relay import BUFFER_LIMIT
from tests.unit.test_channel_relay import CHANNELS, _open, _read


def test_the_relay_holds_at_most_its_limit_while_the_kernel_does_not_read():
    relay, _, channels, workers = _open()
    payload = b"x" * (16 << 20)
    sent = threading.Thread(target=workers[0]["stdout"].sendall, args=(payload,), daemon=True)
    sent.start()
    time.sleep(1.5)
    (session,) = relay._sessions.values()
    held = len(session.buffers[(0, CHANNELS.index("stdout"))])
    assert 0 < held <= BUFFER_LIMIT
    assert sent.is_alive()  # the worker blocks in its write, as on a local pipe
    assert _read(channels[0]["stdout"], len(payload)) == payload
    sent.join(5)
    for sock in channels[0].values():
        sock.close()


def test_a_kernel_that_stops_beating_has_its_ranks_channels_closed():
    """A dead kernel (no beats) behind a Ray Client address: its ranks see their channels end
    after the relay's silence, as they would see a dead kernel's own connections close."""
    started = time.monotonic()  # before _open: the relay's silence clock starts inside it
    relay, _, channels, workers = _open(silence=1.0, beats=False)
    for name in ("alive", "commands"):
        workers[0][name].settimeout(5)
        assert workers[0][name].recv(1) == b""
    assert 1.0 <= time.monotonic() - started < 3.0
    assert relay.sessions() == 1  # closed, not forgotten: a late pull gets None
    (key,) = relay._sessions
    assert relay.pull(key, 0.1) is None
    for sock in (*channels[0].values(), *workers[0].values()):
        sock.close()


def test_a_beating_kernel_keeps_its_session_past_the_silence(monkeypatch):
    monkeypatch.setattr(channel_relay, "BEAT_EVERY", 0.2)
    relay, _, channels, workers = _open(silence=1.5)
    time.sleep(3.0)  # twice the silence, the kernel beating every 0.2 s
    workers[0]["stdout"].sendall(b"still here")
    channels[0]["stdout"].settimeout(5)
    assert _read(channels[0]["stdout"], 10) == b"still here"
    for sock in (*channels[0].values(), *workers[0].values()):
        sock.close()
