"""Samplers ``prepare`` puts into data loaders (the peer's names and semantics).

``SeedableRandomSampler``: the permutation of epoch ``e`` is a function of
``(seed, e)`` only, so ``set_seed(s)`` + ``loader.set_epoch(e)`` replays it exactly.
``SkipBatchSampler``: another batch sampler without its first ``n`` batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose epoch ``e`` draws from a generator seeded with ``seed + e``.

    Args:
        data_source, replacement, num_samples, generator: as for ``RandomSampler``
            (a generator is created when none is given).
        data_seed: the seed; default: ``torch.initial_seed()`` (what ``set_seed`` set).

    The epoch advances by one after every complete pass; ``set_epoch`` sets it.

    Example:
        >>> sampler = SeedableRandomSampler(range(4), data_seed=3)
        >>> first = list(sampler); sampler.set_epoch(0)
        >>> list(sampler) == first
        True
    """

    def __init__(
        self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
        generator: torch.Generator | None = None, data_seed: int | None = None,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        self.initial_seed = torch.initial_seed() if data_seed is None else int(data_seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass draw the permutation of ``epoch``."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.epoch += 1


class SkipBatchSampler(BatchSampler):
    """``batch_sampler`` without its first ``skip_batches`` batches (their samples are never loaded).

    Args:
        batch_sampler: any batch sampler (an iterable of index lists).
        skip_batches: how many batches to leave out.
    """

    def __init__(self, batch_sampler: Any, skip_batches: int = 0) -> None:
        if skip_batches < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}")
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        self.sampler = getattr(batch_sampler, "sampler", None)

    @property
    def total_length(self) -> int:
        """Batches of the whole epoch, skipped ones included."""
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        for index, batch in enumerate(self.batch_sampler):
            if index >= self.skip_batches:
                yield batch

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)
