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
