"""find_executable_batch_size and release_memory (the peer's accelerate.utils.memory names): each
retry and release collects garbage, seconds in a full process (tests/unit/test_memory_helpers.py has the rest)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from notebook_accel import find_executable_batch_size
from notebook_accel.utils import release_memory, should_reduce_batch_size


def test_an_out_of_memory_error_retries_with_a_smaller_batch_and_keeps_it():
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size, scale):
        tried.append(batch_size)
        if batch_size > 50:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size * scale

    assert train(2) == 90 and tried == [64, 57, 51, 45]
    assert train(1) == 45 and tried[-1] == 45  # the size found is kept


def test_other_errors_pass_through_and_a_given_batch_size_is_refused():
    @find_executable_batch_size(starting_batch_size=8, reduce_batch_size_fn=lambda: 0)
    def train(batch_size):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 1 TB")

    with pytest.raises(RuntimeError, match="reached zero"):
        train()

    @find_executable_batch_size
    def broken(batch_size, model):
        raise ValueError("a bug, not memory")

    with pytest.raises(ValueError, match="a bug"):
        broken("model")
    with pytest.raises(TypeError, match="the decorator passes it"):
        broken(16, "model")
    assert not should_reduce_batch_size(RuntimeError("shape mismatch"))


def test_release_memory_returns_none_for_each_and_frees_them():
    a, b = torch.ones(100), torch.zeros(100)
    ref = weakref.ref(a)
    a, b = release_memory(a, b)
    gc.collect()
    assert (a, b) == (None, None) and ref() is None
