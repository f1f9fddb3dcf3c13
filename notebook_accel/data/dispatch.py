"""``DataLoaderDispatcher``: rank 0 loads every batch and sends each process its slice.

For data that only one process can read (a stream, a remote source, a costly
pipeline). Each step, rank 0 takes ``N`` batches of the user's loader (one with
``split_batches``), concatenates them into one global batch and broadcasts it
(``broadcast_object_list``); process ``r`` keeps rows ``[r*b, (r+1)*b)``. Other
ranks never iterate the user's loader, so its worker processes run on rank 0 only.
A short last global batch is, with ``even_batches``, completed with rows of the
first one (``remainder`` then says how many were real, for ``gather_for_metrics``);
without it, later ranks get fewer rows or none. Batches must be (nested) tensors.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import islice
from typing import Any

from torch.utils.data import DataLoader

from notebook_accel.data.shard import DataLoaderShard
from notebook_accel.runtime.helpers import concatenate, find_batch_size
from notebook_accel.runtime.ops import broadcast_object_list, recursively_apply, world_size


class DataLoaderDispatcher(DataLoaderShard):
    """A ``DataLoaderShard`` whose batches come from rank 0 (see the module docstring).

    Args:
        split_batches: each loader batch is one global batch (else ``N`` of them are).
        even_batches: complete a short last global batch with rows of the first.
        process_index, num_processes: this rank and the world size.
        **kwargs: the ``DataLoaderShard`` arguments (the user's unsharded batch sampler).
    """

    def __init__(self, dataset: Any, batch_sampler: Any = None, *, split_batches: bool = False,
                 even_batches: bool = True, process_index: int = 0, num_processes: int = 1,
                 per_process_batch: int | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, batch_sampler, **kwargs)
        if per_process_batch is None:  # built directly: the loader's (or its batch sampler's) batch size
            size = self.batch_size if self.batch_size is not None else self.batch_sampler.batch_size
            per_process_batch = size // num_processes if split_batches else size
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.process_index = process_index
        self.num_processes = num_processes
        self.per_process_batch = per_process_batch

    def _global_batches(self) -> Iterator[Any]:
        """Rank 0: the user's batches grouped per step; every rank: the broadcast result."""
        source = super()._batches() if self.process_index == 0 else None
        group = 1 if self.split_batches else self.num_processes
        while True:
            payload = None
            if source is not None:
                parts = list(islice(source, group))
                payload = concatenate(parts) if parts else None
            if world_size() > 1:
                payload = broadcast_object_list([payload])[0]
            if payload is None:
                return
            yield payload

    def _batches(self) -> Iterator[Any]:
        self._remainder = -1
        per, n, rank = self.per_process_batch, self.num_processes, self.process_index
        first = None
        for batch in self._global_batches():
            recursively_apply(lambda t: t, batch, error_on_other_type=True)  # tensors only
            rows = find_batch_size(batch)
            if first is None:
                first = batch
            if rows < per * n and self.even_batches and n > 1:  # one process: nothing to even out
                self._remainder = rows
                batch = _fill(batch, first, per * n)
            mine = recursively_apply(lambda t: t[rank * per : (rank + 1) * per], batch)
            if find_batch_size(mine) > 0:
                yield mine

    def __len__(self) -> int:
        batches = DataLoader.__len__(self)
        if self.split_batches:
            return batches
        steps = math.ceil(batches / self.num_processes)
        if not self.even_batches and batches % self.num_processes:
            steps -= int(self.process_index >= batches % self.num_processes)
        return steps


def _fill(batch: Any, first: Any, rows: int) -> Any:
    """``batch`` completed to ``rows`` rows with rows of ``first`` (repeated if it is short too)."""
    missing = rows - find_batch_size(batch)
    filler = first
    while find_batch_size(filler) < missing:
        filler = concatenate([filler, first])
    return concatenate([batch, recursively_apply(lambda t: t[:missing], filler)])
