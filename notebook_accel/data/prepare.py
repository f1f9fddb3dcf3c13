"""Data loaders sharded across processes, with checkpointable shuffling and position.

Sharding is batch-level, as in the peer: the original loader's batch sampler makes
global batches 0, 1, 2, ...; rank ``r`` of ``N`` takes batches ``r, r+N, r+2N, ...``.
With ``split_batches`` every global batch is cut into ``N`` equal slices instead.
With ``even_batches`` (default) the last, incomplete round is filled with samples
from the start of the epoch so every rank gets the same number of full batches;
``remainder`` then says how many samples of the last global batch are real, and
``gather_for_metrics`` drops the rest.

Shuffling: a ``RandomSampler`` that brought its own ``generator`` keeps it, as in
the peer, so the samples come in the order one process would see them; rank 0's
generator state is given to every rank at the start of each epoch. A
``RandomSampler`` without one gets our own ``torch.Generator``, seeded the same on
every rank (rank 0's seed is broadcast). With ``use_seedable_sampler`` it becomes a
``SeedableRandomSampler`` (permutation = f(seed, epoch), replayed by ``set_seed`` +
``set_epoch``). The loader's ``state_dict`` holds that generator's state (and the
sampler's epoch) at the start of the current epoch and how many batches of it were
yielded, so a checkpoint can replay the epoch and ``skip_first_batches`` resume
mid-epoch. Skipped batches are never loaded: skipping happens on indices. The
generator also seeds the loader's worker processes, so ``num_workers > 0`` stays
reproducible. A custom sampler keeps its own randomness, which is neither
synchronised nor checkpointed here; ``set_epoch`` is forwarded to it.

Which batches a rank gets: ``sharding`` (map-style) and ``iterable`` (streams). The loader
classes: ``shard`` (``DataLoaderShard``), ``dispatch`` (rank 0 loads), ``skip``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from notebook_accel.data.dispatch import DataLoaderDispatcher
from notebook_accel.data.iterable import IterableDatasetShard, shard_natively
from notebook_accel.data.samplers import SeedableRandomSampler
from notebook_accel.data.shard import DataLoaderShard, LoaderProgress, loader_kwargs
from notebook_accel.data.sharding import ShardBatchSampler
from notebook_accel.runtime.device import device_kind
from notebook_accel.runtime.gradient_state import GradientState
from notebook_accel.runtime.ops import broadcast, world_size

__all__ = [
    "DataLoaderConfiguration", "DataLoaderShard", "LoaderProgress", "shard_data_loader", "skip_first_batches",
]


@dataclass
class DataLoaderConfiguration:
    """How ``prepare`` shards data loaders (the peer's names).

    Attributes:
        split_batches: cut each batch across the processes instead of dealing whole batches.
        even_batches: fill the last round so every process gets the same number of batches.
        non_blocking: copy batches to the device asynchronously (with ``pin_memory``).
        data_seed: seed of the shuffling generator; default: derived from torch's initial
            seed, rank 0's value broadcast so every rank shuffles alike.
        use_seedable_sampler: shuffle with a ``SeedableRandomSampler``: the permutation of
            epoch ``e`` depends only on (seed, ``e``), so ``set_seed`` + ``set_epoch`` replay it.
        use_stateful_dataloader: loaders are torchdata ``StatefulDataLoader`` s (``stateful``;
            ``pip install notebook-accel[stateful]``): after ``load_state`` the next pass resumes
            where the checkpointed epoch stopped (no ``skip_first_batches`` needed).
        dispatch_batches: rank 0 loads every batch and sends each process its slice
            (``dispatch.DataLoaderDispatcher``); default ``None``/``False``: each loads its own.
    """

    split_batches: bool = False
    even_batches: bool = True
    non_blocking: bool = False
    data_seed: int | None = None
    use_seedable_sampler: bool = False
    dispatch_batches: bool | None = None
    use_stateful_dataloader: bool = False

    def shard_kwargs(self) -> dict[str, Any]:
        """These settings as ``shard_data_loader``'s keyword arguments."""
        return {"split_batches": self.split_batches, "even_batches": self.even_batches,
                "non_blocking": self.non_blocking, "seed": self.data_seed,
                "use_stateful_dataloader": self.use_stateful_dataloader, "use_seedable_sampler": self.use_seedable_sampler,
                "dispatch_batches": bool(self.dispatch_batches)}


def skip_first_batches(loader: DataLoader, num_batches: int | None = None) -> DataLoader:
    """A loader over the same data, generator and state that skips the first ``num_batches``.

    Args:
        loader: a prepared loader, or a plain ``DataLoader``.
        num_batches: batches to skip; ``None`` takes ``loader.resume_step`` from the last
            ``load_state`` (0 for a plain loader).

    Returns:
        A new loader; iterate it once for the rest of the epoch, then go back to ``loader``.
        Skipped batches are never loaded (except from an ``IterableDataset``, which
        can only be read in order).
    """
    if not isinstance(loader, DataLoaderShard):
        from notebook_accel.data.skip import skip_plain_batches

        return skip_plain_batches(loader, num_batches or 0)
    skip = loader.resume_step if num_batches is None else num_batches
    if loader.use_stateful_dataloader:  # resumed by hand: torchdata's own resume is dropped
        loader.next_iter_state = None
    kwargs = loader_kwargs(loader)
    kwargs.update(device=loader.device, gradient_state=loader.gradient_state, generator=loader.generator,
                  remainder=loader._remainder, total_batch_size=loader.total_batch_size,
                  non_blocking=loader.non_blocking, progress=loader.progress,
                  synchronize_generator=loader.synchronize_generator,
                  use_stateful_dataloader=loader.use_stateful_dataloader)
    iterable = isinstance(loader.dataset, IterableDataset)
    if iterable:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    if isinstance(loader, DataLoaderDispatcher):  # rank 0 loads and skips; the user's batch sampler as it is
        new = DataLoaderDispatcher(
            loader.dataset, None if iterable else loader.batch_sampler, split_batches=loader.split_batches,
            even_batches=loader.even_batches, process_index=loader.process_index,
            num_processes=loader.num_processes, per_process_batch=loader.per_process_batch, skip_batches=skip,
            **kwargs)
    elif iterable:
        new = DataLoaderShard(loader.dataset, None, skip_batches=skip, **kwargs)
    else:  # a map-style dataset: the sampler skips, nothing is loaded for the skipped batches
        old = loader.shard_sampler or ShardBatchSampler(loader.batch_sampler, 1, 0)  # (built directly: unsharded)
        sampler = ShardBatchSampler(old.batch_sampler, old.num_processes, old.process_index, old.split_batches,
                                    old.even_batches)
        sampler.skip_batches = skip
        new = DataLoaderShard(loader.dataset, sampler, sampler_is_batch_sampler=loader.sampler_is_batch_sampler,
                              **kwargs)
    new.iteration = loader.iteration
    return new


def _shared_seed(index: int, seed: int | None, device: torch.device | None) -> int:
    """``seed``, else one derived from torch's initial seed, rank 0's value on every rank."""
    if seed is not None:
        return seed
    return _rank0_int((torch.initial_seed() + 7919 * (index + 1)) % (2**62), device)


def _rank0_int(number: int, device: torch.device | None) -> int:
    """Rank 0's ``number``, on every rank."""
    value = torch.tensor([number], dtype=torch.int64)
    if world_size() == 1:
        return number
    if device is not None:  # where the group's collectives take it (nccl's, XLA's: the device)
        value = value.to(device_kind(device).collective_device(device))
    return int(broadcast(value, from_process=0).item())


def shard_data_loader(
    loader: DataLoader, *, num_processes: int, process_index: int, device: torch.device | None,
    gradient_state: GradientState, split_batches: bool = False, even_batches: bool = True,
    loader_index: int = 0, non_blocking: bool = False, seed: int | None = None,
    use_stateful_dataloader: bool = False,
    collective_device: torch.device | None = None, use_seedable_sampler: bool = False,
    dispatch_batches: bool = False,
) -> DataLoaderShard:
    """Build this process's ``DataLoaderShard`` from a user's ``DataLoader`` (see the module docstring).

    The one implementation behind ``Accelerator.prepare`` and the peer's ``prepare_data_loader``
    (``loader``, which fills these arguments from its own parameters and ``PartialState``).

    Raises:
        ValueError: ``split_batches`` with a batch size not divisible by ``num_processes``,
            or ``split_batches`` / ``dispatch_batches`` on an ``IterableDataset`` loader without a
            batch size (``batch_size=None``: its samples are sharded one by one).
    """
    generator = torch.Generator()
    generator.manual_seed(_shared_seed(loader_index, seed, collective_device or device))
    common = dict(device=device, gradient_state=gradient_state, generator=generator, non_blocking=non_blocking,
                  use_stateful_dataloader=use_stateful_dataloader)
    if isinstance(loader.dataset, IterableDataset):
        unbatched = loader.batch_size is None  # samples one by one (auto-batching off): shard them one by one
        if unbatched and (split_batches or dispatch_batches):
            raise ValueError("a loader over an IterableDataset with batch_size=None yields single samples: "
                             "split_batches and dispatch_batches need a batch_size")
        if dispatch_batches:
            return _dispatcher(loader, None, num_processes, process_index, split_batches, even_batches, common,
                               batch_size=loader.batch_size, drop_last=loader.drop_last)
        own_shards = shard_natively(loader.dataset, num_processes, process_index, split_batches)
        if own_shards is not None:  # datasets cuts it by files: this process reads only its own
            return DataLoaderShard(
                own_shards, None, total_batch_size=(loader.batch_size or 1) * num_processes,
                batch_size=loader.batch_size, drop_last=loader.drop_last, **common, **loader_kwargs(loader),
            )
        shard_ds = IterableDatasetShard(
            loader.dataset, loader.batch_size or 1, loader.drop_last, num_processes, process_index, split_batches
        )
        known = hasattr(loader.dataset, "__len__") and not loader.drop_last
        return DataLoaderShard(
            shard_ds, None, remainder=len(loader.dataset) % shard_ds.chunk if known else None,
            total_batch_size=shard_ds.chunk, batch_size=None if unbatched else shard_ds.process_batch_size,
            drop_last=False,
            **common, **loader_kwargs(loader),
        )
    sampler_is_batch_sampler = loader.batch_sampler is None and isinstance(loader.sampler, BatchSampler)
    batch_sampler = loader.sampler if sampler_is_batch_sampler else loader.batch_sampler
    sampler = getattr(batch_sampler, "sampler", None)
    synchronize = False
    if isinstance(sampler, RandomSampler) and isinstance(batch_sampler, BatchSampler):
        if use_seedable_sampler and not isinstance(sampler, SeedableRandomSampler):
            data_seed = seed if seed is not None else _shared_initial_seed(collective_device or device)
            sampler = SeedableRandomSampler(
                sampler.data_source, sampler.replacement, sampler._num_samples,
                generator=sampler.generator or generator, data_seed=data_seed,
            )
        elif sampler.generator is None:
            sampler = RandomSampler(
                sampler.data_source, replacement=sampler.replacement,
                num_samples=sampler._num_samples, generator=generator,
            )
        else:  # the user's generator: the order one process would see, rank 0's state on every rank
            synchronize = True
        if sampler is not batch_sampler.sampler:
            batch_sampler = BatchSampler(sampler, batch_sampler.batch_size, batch_sampler.drop_last)
        common["generator"] = sampler.generator
    if dispatch_batches:
        return _dispatcher(loader, batch_sampler, num_processes, process_index, split_batches, even_batches,
                           common, synchronize_generator=synchronize)
    shard = ShardBatchSampler(batch_sampler, num_processes, process_index, split_batches, even_batches)
    global_bs = shard.batch_size
    total = None if global_bs is None else (global_bs if split_batches else global_bs * num_processes)
    remainder = -1
    if even_batches and total is not None and not shard.drop_last:
        remainder = len(sampler if sampler is not None else loader.dataset) % total
    return DataLoaderShard(
        loader.dataset, shard, remainder=remainder, total_batch_size=total,
        sampler_is_batch_sampler=sampler_is_batch_sampler, synchronize_generator=synchronize,
        **common, **loader_kwargs(loader),
    )


def _shared_initial_seed(device: torch.device | None) -> int:
    """``torch.initial_seed()`` of rank 0 (what its ``set_seed`` set), on every rank."""
    return _rank0_int(torch.initial_seed() % (2**62), device)


def _dispatcher(
    loader: DataLoader, batch_sampler: Any, num_processes: int, process_index: int, split_batches: bool,
    even_batches: bool, common: dict[str, Any], **kwargs: Any,
) -> DataLoaderShard:
    """A ``DataLoaderDispatcher`` over the user's (unsharded) batches: rank 0 loads, all get a slice."""
    size = loader.batch_size if loader.batch_size is not None else getattr(batch_sampler, "batch_size", None)
    if size is None or (split_batches and size % num_processes):
        raise ValueError(
            f"dispatch_batches=True needs a fixed batch size{' divisible by the processes' if split_batches else ''}"
            f" ({num_processes}), got batch_size={size}"
        )
    per = size // num_processes if split_batches else size
    total = size if split_batches else size * num_processes
    return DataLoaderDispatcher(
        loader.dataset, batch_sampler, split_batches=split_batches, even_batches=even_batches,
        process_index=process_index, num_processes=num_processes, per_process_batch=per,
        remainder=None, total_batch_size=total, **common, **kwargs, **loader_kwargs(loader),
    )


DataLoaderShard.rest_of_epoch = staticmethod(skip_first_batches)  # a resumed loader's next pass
