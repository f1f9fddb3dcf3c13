"""Helpers for tests of training code (the peer's ``accelerate.test_utils`` names).

``RegressionDataset`` / ``RegressionModel``: y = a*x + b with noise, and the
two-parameter model that learns it, for checks that distributed training ends with
the model one process trains. ``are_the_same_tensors``: equal on every process.
``assert_exception``: a block must raise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset

from notebook_accel.runtime.ops import gather, world_size


class RegressionDataset(Dataset):
    """``length`` samples ``{"x", "y"}`` with ``y = a*x + b + noise`` (float32, NumPy's generator).

    Args:
        a, b: the line.
        length: number of samples.
        seed: seed of the data (the same seed gives the same data on every process).
    """

    def __init__(self, a: float = 2, b: float = 3, length: int = 64, seed: int | None = None) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = (a * self.x + b + rng.normal(scale=0.1, size=(length,))).astype(np.float32)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"x": self.x[index], "y": self.y[index]}


class RegressionModel(torch.nn.Module):
    """``x * a + b`` with scalar parameters ``a`` and ``b`` (initially ``a``, ``b``)."""

    def __init__(self, a: float = 0, b: float = 0) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(float(a)))
        self.b = torch.nn.Parameter(torch.tensor(float(b)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + self.b


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is equal on every process (a collective: every process must call it)."""
    if world_size() == 1:
        return True
    gathered = gather(tensor[None].contiguous())
    return all(torch.equal(row, gathered[0]) for row in gathered)


@contextlib.contextmanager
def assert_exception(exception_class: type[BaseException], msg: str | None = None) -> Iterator[None]:
    """The block must raise ``exception_class`` (with ``msg`` in its text when given).

    Raises:
        AssertionError: nothing, or something else, was raised.
    """
    try:
        yield
    except exception_class as error:
        if msg is not None and msg not in str(error):
            raise AssertionError(f"{exception_class.__name__} raised without {msg!r}: {error}") from error
        return
    except Exception as error:
        raise AssertionError(f"expected {exception_class.__name__}, got {type(error).__name__}: {error}") from error
    raise AssertionError(f"expected {exception_class.__name__}, nothing was raised")


def require_bnb(test: Any) -> Any:
    """Skip ``test`` (pytest) unless bitsandbytes is installed."""
    import pytest

    from notebook_accel.machine.availability import is_bnb_available

    return pytest.mark.skipif(not is_bnb_available(), reason="test requires bitsandbytes")(test)
