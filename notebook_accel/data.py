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

Which batches a rank gets: ``sharding`` (map-style) and ``data_iterable`` (streams).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from notebook_accel.data_iterable import IterableDatasetShard
from notebook_accel.gradient_state import GradientState
from notebook_accel.ops import broadcast, send_to_device, world_size
from notebook_accel.rng_sync import synchronize_rng_state
from notebook_accel.samplers import SeedableRandomSampler
from notebook_accel.sharding import ShardBatchSampler

_LOADER_ARGS = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
    "multiprocessing_context", "persistent_workers",
)


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
        use_stateful_dataloader: after ``load_state``, the next pass over a loader resumes
            where the checkpointed epoch stopped (no ``skip_first_batches`` needed).
        dispatch_batches: rank 0 loads every batch and sends each process its slice
            (``data_dispatch.DataLoaderDispatcher``); default ``None``/``False``: each loads its own.
    """

    split_batches: bool = False
    even_batches: bool = True
    non_blocking: bool = False
    data_seed: int | None = None
    use_seedable_sampler: bool = False
    dispatch_batches: bool | None = None
    use_stateful_dataloader: bool = False


class LoaderProgress:
    """Where a loader stands in its epoch; shared with the loaders ``skip_first_batches`` makes."""

    def __init__(self, generator: torch.Generator, sampler: Any = None) -> None:
        self.generator = generator
        self.sampler = sampler if hasattr(sampler, "set_epoch") and hasattr(sampler, "epoch") else None
        self.epoch_start_state = generator.get_state()
        self.epoch_start = self._epoch()
        self.batches_yielded = 0
        self.in_epoch = False
        self.resume_step = 0  # batches already done in the epoch a checkpoint interrupted

    def _epoch(self) -> int | None:
        return None if self.sampler is None else int(self.sampler.epoch)

    def start_epoch(self) -> None:
        """Remember where the epoch that starts now begins."""
        self.epoch_start_state = self.generator.get_state()
        self.epoch_start = self._epoch()

    def state_dict(self) -> dict[str, Any]:
        """Generator state (and sampler epoch) and position: replays an unfinished epoch, or starts the next."""
        if self.in_epoch:
            state = {"generator": self.epoch_start_state, "batches_yielded": self.batches_yielded}
            if self.epoch_start is not None:
                state["epoch"] = self.epoch_start
            return state
        state = {"generator": self.generator.get_state(), "batches_yielded": 0}
        if self.sampler is not None:
            state["epoch"] = self._epoch()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        if self.sampler is not None and "epoch" in state:
            self.sampler.set_epoch(int(state["epoch"]))
        self.resume_step = int(state["batches_yielded"])
        self.in_epoch = False


class DataLoaderShard(DataLoader):
    """A ``DataLoader`` yielding this process's share, on its device.

    Created by ``Accelerator.prepare``; see the module docstring. Extra attributes:
    ``end_of_dataloader``, ``remainder``, ``total_batch_size``, ``resume_step``.
    """

    def __init__(
        self, dataset: Any, batch_sampler: ShardBatchSampler | None = None, *, device: torch.device | None,
        gradient_state: GradientState, generator: torch.Generator, remainder: int | None,
        total_batch_size: int | None, non_blocking: bool = False,
        progress: LoaderProgress | None = None, skip_batches: int = 0, auto_resume: bool = False,
        sampler_is_batch_sampler: bool = False, synchronize_generator: bool = False,
        **kwargs: Any,
    ) -> None:
        if batch_sampler is not None and sampler_is_batch_sampler:  # the user's sampler yields index lists
            super().__init__(dataset, sampler=batch_sampler, batch_size=None, generator=generator, **kwargs)
        elif batch_sampler is not None:
            super().__init__(dataset, batch_sampler=batch_sampler, generator=generator, **kwargs)
        else:  # an IterableDatasetShard: batch_size and drop_last come in kwargs
            super().__init__(dataset, generator=generator, **kwargs)
        self.sampler_is_batch_sampler = sampler_is_batch_sampler
        self.synchronize_generator = synchronize_generator  # the user's generator: rank 0's state each epoch
        self.device = device
        self.gradient_state = gradient_state
        self._remainder = remainder
        self.total_batch_size = total_batch_size
        self.non_blocking = non_blocking
        self.end_of_dataloader = False
        self.progress = progress if progress is not None else LoaderProgress(generator, self._inner_sampler())
        self.skip_batches = skip_batches  # iterable datasets only: these batches are loaded, then dropped
        self.auto_resume = auto_resume
        self._pending_skip = 0
        self.iteration = 0

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch (-1: unknown or no duplicates to drop)."""
        if self._remainder is not None:
            return self._remainder
        return getattr(self.dataset, "remainder", -1)

    @property
    def resume_step(self) -> int:
        """Batches the interrupted epoch had done, as restored by ``load_state`` (else 0)."""
        return self.progress.resume_step

    @property
    def shard_sampler(self) -> ShardBatchSampler | None:
        """The batch sampler for a map-style dataset; ``None`` for an iterable one."""
        sampler = self.sampler if self.sampler_is_batch_sampler else self.batch_sampler
        return sampler if isinstance(sampler, ShardBatchSampler) else None

    def _inner_sampler(self) -> Any:
        """The user's sampler inside the sharding (or the iterable dataset): ``set_epoch`` goes there."""
        shard = self.shard_sampler
        if shard is not None:
            inner = shard.batch_sampler
        elif isinstance(self.dataset, IterableDataset):
            return self.dataset
        else:  # a dispatcher: the user's own batch sampler
            inner = self.batch_sampler
        return inner if hasattr(inner, "set_epoch") else getattr(inner, "sampler", inner)

    def __iter__(self) -> Iterator[Any]:
        progress = self.progress
        if self.synchronize_generator and world_size() > 1:
            synchronize_rng_state("generator", self.generator)
        progress.start_epoch()
        sampler = self.shard_sampler
        resume, self._pending_skip = self._pending_skip, 0  # iterable datasets (samplers skip by themselves)
        if sampler is not None:
            progress.batches_yielded = sampler.skip_batches + sampler.skip_once
        else:
            progress.batches_yielded = self.skip_batches + resume
        progress.resume_step = 0
        progress.in_epoch = True
        self.end_of_dataloader = False
        self.gradient_state.add_dataloader(self)
        try:
            it = self._batches()
            for _ in range(self.skip_batches + resume):
                next(it, None)
            if self.device is not None and self.device.type == "xla":
                from notebook_accel.xla import runtime as xla

                it = xla.device_batches(it, self.device)  # moves batches and marks step boundaries
            try:
                current = next(it)
            except StopIteration:
                self.end_of_dataloader = True
                progress.in_epoch = False
                return
            while True:
                try:
                    upcoming = next(it)
                except StopIteration:
                    self.end_of_dataloader = True
                    progress.batches_yielded += 1
                    progress.in_epoch = False
                    yield self._to_device(current)
                    break
                progress.batches_yielded += 1
                yield self._to_device(current)
                current = upcoming
        finally:
            self.gradient_state.remove_dataloader(self)
            self.iteration += 1

    def _batches(self) -> Iterator[Any]:
        """This process's batches before the device move (the dispatcher overrides it)."""
        return super().__iter__()

    def _to_device(self, batch: Any) -> Any:
        if self.device is None or self.device.type == "xla":  # XLA: moved by device_batches
            return batch
        return send_to_device(batch, self.device, self.non_blocking)

    def set_epoch(self, epoch: int) -> None:
        """Forward ``epoch`` to the sampler, batch sampler or iterable dataset that has ``set_epoch``.

        With ``use_seedable_sampler`` this (after ``set_seed``) replays that epoch's shuffle.
        Our own generator needs no epoch: its shuffle already differs per epoch.
        """
        sampler = self._inner_sampler()
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Generator state and position: replays an unfinished epoch, or starts the next."""
        return self.progress.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``; ``resume_step`` tells how many batches the epoch had done.

        With ``auto_resume`` (``use_stateful_dataloader``) the next pass skips them by itself.
        """
        self.progress.load_state_dict(state)
        if self.auto_resume:
            self._set_pending(self.progress.resume_step)

    def _set_pending(self, batches: int) -> None:
        sampler = self.shard_sampler
        if sampler is not None:
            sampler.skip_once = batches
        else:
            self._pending_skip = batches

    def __len__(self) -> int:
        return max(super().__len__() - self._pending_skip, 0)


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
        from notebook_accel.data_skip import skip_plain_batches

        return skip_plain_batches(loader, num_batches or 0)
    skip = loader.resume_step if num_batches is None else num_batches
    loader._set_pending(0)  # resumed by hand: no automatic resume on top
    old = loader.shard_sampler
    kwargs = _loader_kwargs(loader)
    sampler = None
    if old is not None:
        sampler = ShardBatchSampler(old.batch_sampler, old.num_processes, old.process_index, old.split_batches, old.even_batches)
        sampler.skip_batches = skip
    else:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    return DataLoaderShard(
        loader.dataset, sampler, device=loader.device, gradient_state=loader.gradient_state,
        generator=loader.generator, remainder=loader._remainder, total_batch_size=loader.total_batch_size,
        non_blocking=loader.non_blocking, progress=loader.progress, skip_batches=0 if old else skip,
        sampler_is_batch_sampler=loader.sampler_is_batch_sampler,
        synchronize_generator=loader.synchronize_generator, **kwargs,
    )


def _loader_kwargs(loader: DataLoader) -> dict[str, Any]:
    kwargs = {k: getattr(loader, k) for k in _LOADER_ARGS}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return kwargs


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
    if device is not None and device.type in ("cuda", "xla"):  # nccl / xla collectives need it there
        value = value.to(device)
    return int(broadcast(value, from_process=0).item())


def prepare_data_loader(
    loader: DataLoader, *, num_processes: int, process_index: int, device: torch.device | None,
    gradient_state: GradientState, split_batches: bool = False, even_batches: bool = True,
    loader_index: int = 0, non_blocking: bool = False, seed: int | None = None, auto_resume: bool = False,
    collective_device: torch.device | None = None, use_seedable_sampler: bool = False,
    dispatch_batches: bool = False,
) -> DataLoaderShard:
    """Build this process's ``DataLoaderShard`` from a user's ``DataLoader`` (see the module docstring).

    Raises:
        ValueError: ``split_batches`` with a batch size not divisible by ``num_processes``,
            or an ``IterableDataset`` loader without a batch size.
    """
    generator = torch.Generator()
    generator.manual_seed(_shared_seed(loader_index, seed, collective_device or device))
    common = dict(device=device, gradient_state=gradient_state, generator=generator, non_blocking=non_blocking,
                  auto_resume=auto_resume)
    if isinstance(loader.dataset, IterableDataset):
        if loader.batch_size is None:
            raise ValueError("prepare() needs a batch_size on a loader over an IterableDataset")
        if dispatch_batches:
            return _dispatcher(loader, None, num_processes, process_index, split_batches, even_batches, common,
                               batch_size=loader.batch_size, drop_last=loader.drop_last)
        shard_ds = IterableDatasetShard(
            loader.dataset, loader.batch_size, loader.drop_last, num_processes, process_index, split_batches
        )
        known = hasattr(loader.dataset, "__len__") and not loader.drop_last
        return DataLoaderShard(
            shard_ds, None, remainder=len(loader.dataset) % shard_ds.chunk if known else None,
            total_batch_size=shard_ds.chunk, batch_size=shard_ds.process_batch_size, drop_last=False,
            **common, **_loader_kwargs(loader),
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
        **common, **_loader_kwargs(loader),
    )


def _shared_initial_seed(device: torch.device | None) -> int:
    """``torch.initial_seed()`` of rank 0 (what its ``set_seed`` set), on every rank."""
    return _rank0_int(torch.initial_seed() % (2**62), device)


def _dispatcher(
    loader: DataLoader, batch_sampler: Any, num_processes: int, process_index: int, split_batches: bool,
    even_batches: bool, common: dict[str, Any], **kwargs: Any,
) -> DataLoaderShard:
    """A ``DataLoaderDispatcher`` over the user's (unsharded) batches: rank 0 loads, all get a slice."""
    from notebook_accel.data_dispatch import DataLoaderDispatcher

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
        remainder=None, total_batch_size=total, **common, **kwargs, **_loader_kwargs(loader),
    )
