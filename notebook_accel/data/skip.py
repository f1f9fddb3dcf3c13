"""Skipping the first batches of a plain (unprepared) ``DataLoader``.

A map-style loader gets a ``SkipBatchSampler``, so the skipped samples are never
loaded; a loader without a batch sampler (an ``IterableDataset``, or
``batch_size=None``) becomes a ``SkipDataLoader``, which loads and drops them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from notebook_accel.data.adapter import DataLoaderAdapter
from notebook_accel.data.samplers import SkipBatchSampler

_COPIED = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
    "multiprocessing_context", "generator", "persistent_workers",
)


class SkipDataLoader(DataLoaderAdapter):
    """A ``DataLoader`` whose every pass leaves out its first ``skip_batches`` batches.

    Args:
        dataset: as for ``DataLoader``.
        skip_batches: batches to drop at the start of each pass.
        use_stateful_dataloader: a torchdata ``StatefulDataLoader`` (``stateful.stateful_twin``).
        **kwargs: every other ``DataLoader`` argument.
    """

    def __init__(self, dataset: Any, skip_batches: int = 0, use_stateful_dataloader: bool = False,
                 **kwargs: Any) -> None:
        if skip_batches < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}")
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches
        self.use_stateful_dataloader = use_stateful_dataloader

    def __iter__(self) -> Iterator[Any]:
        for index, batch in enumerate(super().__iter__()):
            if index >= self.skip_batches:
                yield batch

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)


def _kwargs(loader: DataLoader) -> dict[str, Any]:
    kwargs = {name: getattr(loader, name) for name in _COPIED}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return kwargs


def skip_plain_batches(loader: DataLoader, num_batches: int) -> DataLoader:
    """A new loader over ``loader``'s data without its first ``num_batches`` batches.

    Raises:
        TypeError: ``loader`` is not a ``DataLoader``.
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"skip_first_batches takes a DataLoader, not {type(loader).__name__}")
    kwargs = _kwargs(loader)
    iterable = isinstance(loader.dataset, IterableDataset)
    if loader.batch_sampler is not None and not iterable:
        sampler = SkipBatchSampler(loader.batch_sampler, num_batches)
        return DataLoader(loader.dataset, batch_sampler=sampler, **kwargs)
    sampler_kw = {} if iterable else {"sampler": loader.sampler}
    return SkipDataLoader(
        loader.dataset, num_batches, batch_size=loader.batch_size, drop_last=loader.drop_last, **sampler_kw, **kwargs
    )
