"""The workers' event channel under a reader that never reads (200,000 events through a real pipe)."""

from __future__ import annotations


def test_event_channel_is_bounded_coalesces_and_never_blocks():
    import os

    from notebook_accel.events import EventChannel
    from notebook_accel.wire import FrameReader, Kind

    read_fd, write_fd = os.pipe()
    try:
        channel = EventChannel(write_fd)
        reader = FrameReader(read_fd)
        os.set_blocking(read_fd, False)
        for i in range(200_000):  # nobody reads: the pipe fills, then the queue
            channel.emit("progress", {"n": i}, key="bar")
            channel.emit("metrics", {"step": i})
        assert len(channel.queue) <= 10_001  # bounded; the progress slot coalesced
        assert channel.dropped > 0
        events, still_open = reader.read()
        assert still_open and events
        steps = [message.step for message in events if message.kind is Kind.METRICS]
        assert steps == sorted(steps) and steps[0] == 0  # in order, from the start
        big = {"desc": "x" * 10_000}
        assert channel.emit(Kind.PROGRESS, big) is False  # larger than an atomic write
    finally:
        os.close(read_fd)
        os.close(write_fd)
