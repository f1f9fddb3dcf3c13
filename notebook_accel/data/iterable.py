"""Sharding an ``IterableDataset`` across processes (the peer's ``IterableDatasetShard`` semantics).

Every process reads the whole stream and keeps its slice of each global batch:
with ``N`` processes and batch size ``b``, chunks of ``b*N`` samples (``b`` with
``split_batches``) are cut, and process ``r`` keeps samples ``[r*b', (r+1)*b')`` of
each, ``b'`` being its own batch size. Unless ``drop_last``, the last short chunk is
completed with samples from the first one, so every process gets the same number
of full batches; ``remainder`` then says how many samples of that chunk were real,
for ``gather_for_metrics``. Known in the main process only with ``num_workers=0``
or a dataset with ``__len__``; otherwise the duplicates are not dropped.

A ``datasets.IterableDataset`` with at least as many shards (files) as processes is instead
cut by datasets itself (``shard_natively``), as the peer does: each process reads only its own
files. Their lengths may differ, so the processes may get different numbers of batches (the
peer's behaviour too): give such a dataset shards of equal size, or ``n_shards`` below the
number of processes to have every process read the whole stream and keep its slice.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset


class IterableDatasetShard(IterableDataset):
    """This process's share of ``dataset`` (see the module docstring).

    Args:
        dataset: the stream.
        batch_size: the user's loader batch size (global when ``split_batches``).
        drop_last: drop the last short chunk instead of completing it.
        num_processes: ``N``.
        process_index: this rank.
        split_batches: ``batch_size`` is the global batch, cut into ``N`` slices.

    Raises:
        ValueError: ``split_batches`` with a batch size not divisible by ``N``.
    """

    def __init__(
        self, dataset: Any, batch_size: int, drop_last: bool, num_processes: int, process_index: int,
        split_batches: bool = False,
    ) -> None:
        if split_batches and batch_size % num_processes:
            raise ValueError(
                f"split_batches=True needs a batch size divisible by the {num_processes} processes, "
                f"got batch_size={batch_size}"
            )
        self.dataset = dataset
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.chunk = batch_size if split_batches else batch_size * num_processes
        self.process_batch_size = batch_size // num_processes if split_batches else batch_size
        self.remainder = -1  # set when the last chunk has been cut

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the stream, when it has ``set_epoch``."""
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        n = len(self.dataset)
        chunks = n // self.chunk if self.drop_last else math.ceil(n / self.chunk)
        return chunks * self.process_batch_size

    def __iter__(self) -> Iterator[Any]:
        self.remainder = -1
        start = self.process_index * self.process_batch_size
        mine = slice(start, start + self.process_batch_size)
        first: list[Any] | None = None
        current: list[Any] = []
        for sample in self.dataset:
            current.append(sample)
            if len(current) == self.chunk:
                if first is None:
                    first = list(current)
                yield from current[mine]
                current = []
        if not current or self.drop_last:
            self.remainder = 0
            return
        self.remainder = len(current)
        filler = first if first is not None else list(current)
        while len(current) < self.chunk:
            current.extend(filler[: self.chunk - len(current)])
        yield from current[mine]


def shard_natively(dataset: Any, num_processes: int, process_index: int, split_batches: bool) -> Any | None:
    """This process's shards of a ``datasets.IterableDataset`` with ``n_shards >= num_processes``
    (``dataset.shard``), or ``None`` when it is no such dataset, or with ``split_batches``."""
    datasets = sys.modules.get("datasets")  # such a dataset exists only once datasets is imported
    if datasets is None or split_batches or num_processes == 1:
        return None
    if not isinstance(dataset, datasets.IterableDataset) or dataset.n_shards < num_processes:
        return None
    return dataset.shard(num_shards=num_processes, index=process_index)
