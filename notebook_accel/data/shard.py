"""``DataLoaderShard``: the loader a process iterates (its share, on its device) and its position.

The base the other loaders build on (``dispatch.DataLoaderDispatcher`` subclasses it);
``prepare`` assembles them from a user's loader (``prepare_data_loader``, ``skip_first_batches``)
and its docstring describes the sharding, shuffling and checkpointing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from notebook_accel.data import torchdata_state
from notebook_accel.data.adapter import DataLoaderAdapter, DataLoaderStateMixin
from notebook_accel.data.sharding import ShardBatchSampler
from notebook_accel.runtime.device import device_kind
from notebook_accel.runtime.gradient_state import GradientState
from notebook_accel.runtime.ops import send_to_device, world_size
from notebook_accel.runtime.rng_sync import synchronize_rng_state

_LOADER_ARGS = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
    "multiprocessing_context", "persistent_workers",
)


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
        self.skip_on_next_pass = False  # the next pass leaves those out by itself (after ``Accelerator.resume``)

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


class DataLoaderShard(DataLoaderAdapter, DataLoaderStateMixin):
    """A ``DataLoader`` yielding this process's share, on its device.

    Created by ``Accelerator.prepare``; see the module docstring. Extra attributes:
    ``end_of_dataloader``, ``remainder``, ``total_batch_size``, ``resume_step``. Built directly
    (``DataLoaderShard(dataset, batch_size=4)``, as the peer's) it is a plain loader of this
    process with its own ``GradientState``. ``use_stateful_dataloader=True`` gives its
    torchdata twin (``stateful.stateful_twin``), as the peer's does.
    """

    def __init__(
        self, dataset: Any, batch_sampler: ShardBatchSampler | None = None, *, device: torch.device | None = None,
        gradient_state: GradientState | None = None, generator: torch.Generator | None = None,
        remainder: int | None = None, total_batch_size: int | None = None, non_blocking: bool = False,
        progress: LoaderProgress | None = None, skip_batches: int = 0, use_stateful_dataloader: bool = False,
        sampler_is_batch_sampler: bool = False, synchronize_generator: bool = False,
        **kwargs: Any,
    ) -> None:
        if generator is None:  # built directly: seeded from the global RNG, as DataLoader's own would be
            generator = torch.Generator()
            generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        if batch_sampler is not None and sampler_is_batch_sampler:  # the user's sampler yields index lists
            super().__init__(dataset, sampler=batch_sampler, batch_size=None, generator=generator, **kwargs)
        elif batch_sampler is not None:
            super().__init__(dataset, batch_sampler=batch_sampler, generator=generator, **kwargs)
        else:  # an IterableDatasetShard: batch_size and drop_last come in kwargs
            super().__init__(dataset, generator=generator, **kwargs)
        self.sampler_is_batch_sampler = sampler_is_batch_sampler
        self.synchronize_generator = synchronize_generator  # the user's generator: rank 0's state each epoch
        self.device = device
        self.device_kind = device_kind(device) if device is not None else None  # asked per batch
        self.gradient_state = gradient_state if gradient_state is not None else GradientState()
        self._remainder = remainder
        self.total_batch_size = total_batch_size if total_batch_size is not None else self.batch_size
        self.non_blocking = non_blocking
        self.end_of_dataloader = False
        self.progress = progress if progress is not None else LoaderProgress(generator, self._inner_sampler())
        self.skip_batches = skip_batches  # iterable datasets only: these batches are loaded, then dropped
        self.use_stateful_dataloader = use_stateful_dataloader
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

    # ``prepare.skip_first_batches``, which builds on this module and fills it in when imported
    rest_of_epoch: Callable[[DataLoaderShard, int], DataLoaderShard]

    def skip_seen_on_next_pass(self, saved_world_size: int | None = None) -> None:
        """Make the next pass over this loader leave out the batches the restored epoch had done
        (``resume_step``), as ``skip_first_batches`` would; later passes are whole epochs again.
        ``saved_world_size``: the processes that had done them, where not this job's (a resharded
        resume): each step dealt one batch to each of them, so this one leaves out the batches
        they had together (rounded down: a part is done again); with ``split_batches`` a step is
        one batch on any world size."""
        progress = self.progress
        split = getattr(self, "split_batches", None)
        if split is None:  # a shard: its batch sampler deals or splits
            split = getattr(self.batch_sampler, "split_batches", False)
        if saved_world_size and saved_world_size != world_size() and not split:
            progress.resume_step = progress.resume_step * saved_world_size // world_size()
        progress.skip_on_next_pass = progress.resume_step > 0 and not self.use_stateful_dataloader

    def __iter__(self) -> Iterator[Any]:
        progress = self.progress
        if progress.skip_on_next_pass:
            progress.skip_on_next_pass = False
            rest = self.rest_of_epoch(self, progress.resume_step)
            try:
                yield from rest
            finally:
                self.iteration = rest.iteration
            return
        if self.synchronize_generator and world_size() > 1:
            synchronize_rng_state("generator", self.generator)
        progress.start_epoch()
        sampler = self.shard_sampler
        progress.batches_yielded = sampler.skip_batches if sampler is not None else self.skip_batches
        progress.resume_step = 0
        progress.in_epoch = True
        self.begin()
        try:
            it = self._batches()
            for _ in range(self.skip_batches):
                next(it, None)
            if self.device is not None:
                it = self.device_kind.batches(it, self.device)  # XLA's moves them, marking steps
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
            self.end()
            self.iteration += 1

    def _batches(self) -> Iterator[Any]:
        """This process's batches before the device move (the dispatcher overrides it)."""
        return super().__iter__()

    def _to_device(self, batch: Any) -> Any:
        if self.device_kind is None or self.device_kind.moves_batches:  # moved by its ``batches``
            return batch
        return send_to_device(batch, self.device, self.non_blocking)

    def set_epoch(self, epoch: int) -> None:
        """Forward ``epoch`` to the batch sampler, its sampler, or the iterable dataset that has ``set_epoch``.

        With ``use_seedable_sampler`` this (after ``set_seed``) replays that epoch's shuffle.
        Our own generator needs no epoch: its shuffle already differs per epoch.
        """
        self.iteration = epoch  # the epoch counter (the peer's name), which __iter__ advances
        inner = self._inner_sampler()
        for target in (inner, getattr(inner, "sampler", None)):  # a batch sampler's own sampler too
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)

    def get_sampler(self) -> Any:
        """The sampler inside this loader's batch sampler (the peer's ``get_sampler``)."""
        shard = self.shard_sampler
        if shard is not None:
            return getattr(shard.batch_sampler, "sampler", None)
        return getattr(self.sampler if self.sampler_is_batch_sampler else self.batch_sampler, "sampler", None)

    def state_dict(self) -> dict[str, Any]:
        """Generator state and position: replays an unfinished epoch, or starts the next."""
        return self.progress.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``; ``resume_step`` tells how many batches the epoch had done
        (``skip_first_batches`` skips them; a stateful loader resumes by itself). A stateful
        loader's state (torchdata's: the peer's ``dl_state_dict.bin``) gives its batches done."""
        if not torchdata_state.is_torchdata_state(state):
            self.progress.load_state_dict(state)
            return
        if torchdata_state.PROGRESS_KEY in state:  # written by our stateful loader: the shuffle's generator too
            self.progress.load_state_dict(state[torchdata_state.PROGRESS_KEY])
        self.progress.resume_step = torchdata_state.batches_done(state)
        self.progress.in_epoch = False


def loader_kwargs(loader: DataLoader) -> dict[str, Any]:
    """The user loader's worker and collation settings, to build a loader like it."""
    kwargs = {k: getattr(loader, k) for k in _LOADER_ARGS}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return kwargs
