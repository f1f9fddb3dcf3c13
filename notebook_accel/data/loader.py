"""The peer's ``accelerate.data_loader`` names: ``prepare_data_loader`` with its parameters, and the loader classes.

``prepare_data_loader`` here works without an ``Accelerator`` (as the peer's does):
ranks and device default to ``PartialState()``'s. The classes are ours
(``prepare``, ``dispatch``, ``skip``, ``samplers``, ``sharding``,
``iterable``), under the peer's names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from notebook_accel.data.adapter import DataLoaderAdapter, DataLoaderStateMixin
from notebook_accel.data.dispatch import DataLoaderDispatcher
from notebook_accel.data.iterable import IterableDatasetShard
from notebook_accel.data.prepare import DataLoaderShard, shard_data_loader, skip_first_batches
from notebook_accel.data.samplers import SeedableRandomSampler, SkipBatchSampler
from notebook_accel.data.sharding import ShardBatchSampler as BatchSamplerShard
from notebook_accel.data.skip import SkipDataLoader
from notebook_accel.runtime.gradient_state import GradientState
from notebook_accel.runtime.state import PartialState

__all__ = [
    "BatchSamplerShard", "DataLoaderAdapter", "DataLoaderDispatcher", "DataLoaderStateMixin", "DataLoaderShard", "IterableDatasetShard",
    "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader", "prepare_data_loader", "skip_first_batches",
]


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[str] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> DataLoaderShard:
    """This process's share of ``dataloader`` (the peer's function and parameters).

    Args:
        dataloader: the user's loader.
        device: where batches go with ``put_on_device``; default ``PartialState().device``.
        num_processes, process_index: default from ``PartialState()``.
        split_batches, even_batches, use_seedable_sampler, data_seed, non_blocking:
            see ``DataLoaderConfiguration``.
        put_on_device: move batches to ``device``.
        rng_types: generators to synchronise each epoch; only the sampler's
            ``"generator"`` matters here (it is always synchronised); others are refused.
        dispatch_batches: rank 0 loads and sends slices (``DataLoaderDispatcher``).
        use_stateful_dataloader: a torchdata ``StatefulDataLoader`` (resumes mid-epoch after
            ``load_state_dict`` by itself).
        slice_fn_for_dispatch, torch_device_mesh: not supported; must stay ``None``.

    Raises:
        ValueError: an unsupported option, or a batch size ``split_batches`` cannot divide.
    """
    if slice_fn_for_dispatch is not None or torch_device_mesh is not None:
        raise ValueError(
            "slice_fn_for_dispatch and torch_device_mesh are not supported by notebook_accel; leave them None"
        )
    unknown = [t for t in rng_types or [] if str(getattr(t, "value", t)) != "generator"]
    if unknown:
        raise ValueError(
            f"rng_types={rng_types!r}: only 'generator' is synchronised per epoch here; call "
            "synchronize_rng_states() yourself for the others"
        )
    state = PartialState()
    target = device if device is not None else state.device
    return shard_data_loader(
        dataloader,
        num_processes=state.num_processes if num_processes is None else num_processes,
        process_index=state.process_index if process_index is None else process_index,
        device=target if put_on_device else None, gradient_state=GradientState(),
        split_batches=split_batches, even_batches=even_batches, non_blocking=non_blocking, seed=data_seed,
        use_stateful_dataloader=use_stateful_dataloader, collective_device=state.device,
        use_seedable_sampler=use_seedable_sampler, dispatch_batches=bool(dispatch_batches),
    )
