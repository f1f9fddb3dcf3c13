"""BoundedSelector: a select takes a few ready channels, and every ready one gets its turn."""

import os
import time

import pytest

from notebook_accel.launch.supervision.bounded_selector import BoundedSelector


@pytest.fixture
def pipes():
    made = [os.pipe() for _ in range(200)]
    yield made
    for r, w in made:
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass


def test_a_select_takes_at_most_a_few_and_goes_round_every_ready_channel(pipes):
    with BoundedSelector() as selector:
        for index, (r, w) in enumerate(pipes):
            selector.register(r, ("rank", index))
            os.write(w, b"x")  # every one ready, and staying so (nothing is read)
        assert len(selector) == 200 and pipes[0][0] in selector
        seen = []
        for _ in range(4):
            got = selector.select(0, most=50)
            assert len(got) == 50
            seen += got
        assert sorted(index for _, index in seen) == list(range(200))  # each once, in turn


def test_a_select_waits_when_nothing_is_ready_and_forgets_what_was_unregistered(pipes):
    (r1, w1) = pipes[1]
    r0, w0 = os.pipe()  # closed below, by the test
    with BoundedSelector() as selector:
        selector.register(r0, "a")
        selector.register(r1, "b")
        with pytest.raises(KeyError, match=str(r0)):
            selector.register(r0, "again")
        began = time.monotonic()
        assert selector.select(0.05, most=8) == []
        assert time.monotonic() - began >= 0.04
        os.write(w0, b"x")
        os.write(w1, b"x")
        selector.unregister(r1)
        os.close(r0)  # closed before it is unregistered: the kernel forgot it already
        os.close(w0)
        selector.unregister(r0)
        assert selector.select(0, most=8) == [] and len(selector) == 0
        with pytest.raises(KeyError):
            selector.unregister(r1)


class _Handle:
    """A rank's four channels and its sentinel, real pipes (the read ends the kernel's)."""

    inbox = None

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.ends = [os.pipe() for _ in range(5)]
        (self.stdout_fd, _), (self.stderr_fd, _), (self.control_fd, _), (self.events_fd, _), \
            (self.sentinel, _) = self.ends

    def write(self, which: int) -> None:
        os.write(self.ends[which][1], b"x")

    def close(self) -> None:
        for pair in self.ends:
            for fd in pair:
                os.close(fd)


def test_kept_channels_register_only_a_replaced_handle_even_on_its_old_descriptor_numbers():
    """A warm pool's channels stay registered between runs; a healed rank's new handle (whose
    pipes may take the numbers of its closed ones) is registered anew, and heard."""
    from notebook_accel.launch.backends.base import ChannelKeeper
    from notebook_accel.launch.supervision.ready_channels import ReadyChannels
    from notebook_accel.launch.supervision.watched import Worker

    class _Worker(Worker):  # no frame readers needed here
        def __post_init__(self) -> None:
            pass

    keeper, first = ChannelKeeper(), [_Handle(0), _Handle(1)]
    workers = [_Worker(h) for h in first]
    channels = ReadyChannels.kept(keeper, {w.rank: w for w in workers}, record=None)
    channels.register(workers)
    assert len(channels.selector) == 8 and len(channels.event_selector) == 2
    again = [_Worker(h) for h in first]  # the next run, same handles: nothing registered anew
    assert ReadyChannels.kept(keeper, {w.rank: w for w in again}, record=None) is channels
    channels.register(again)
    first[1].write(0)
    assert list(channels.ready(1.0)) == [(1, "stdout")]
    channels.left.clear()
    numbers = {first[1].stdout_fd, first[1].control_fd}
    first[1].close()  # rank 1 healed: its pipes closed, new ones (the same numbers, mostly)
    healed = _Handle(1)
    assert numbers & {healed.stdout_fd, healed.control_fd}  # the case this guards
    workers = [_Worker(first[0]), _Worker(healed)]
    channels = ReadyChannels.kept(keeper, {w.rank: w for w in workers}, record=None)
    channels.register(workers)
    assert len(channels.selector) == 8 and channels.selector.select(0) == []
    healed.write(2)
    assert list(channels.ready(1.0)) == [(1, "control")]
    healed.write(3)
    assert list(channels.ready_events()) == [1]
    keeper.close()
    assert keeper.channels is None
    first[0].close()
    healed.close()
