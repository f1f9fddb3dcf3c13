"""Which batches each process takes from a map-style dataset (the peer's semantics).

Batch-level sharding: the original loader's batch sampler makes global batches
0, 1, 2, ...; rank ``r`` of ``N`` takes batches ``r, r+N, r+2N, ...``. With
``split_batches`` every global batch is cut into ``N`` equal slices instead. With
``even_batches`` the last, incomplete round is filled with samples from the start of
the epoch, so every rank gets the same number of full batches (a batch sampler
without a fixed ``batch_size`` fills it with whole batches from the start of the
epoch instead, as the peer does); without it, ranks may get one batch fewer. One
process gets the batches as they are (nothing to even out).
``drop_last`` drops the incomplete round. No sample is ever dropped silently:
``split_batches`` refuses batches it cannot cut into equal slices.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler


class ShardBatchSampler(Sampler[list[int]]):
    """Yield this rank's batches of ``batch_sampler`` (see the module docstring).

    Args:
        batch_sampler: the global batch sampler.
        num_processes: ``N``.
        process_index: this rank.
        split_batches: slice each global batch instead of dealing whole batches.
        even_batches: fill the last round so every rank gets the same full batches.
    """

    def __init__(
        self, batch_sampler: Any, num_processes: int, process_index: int,
        split_batches: bool = False, even_batches: bool = True,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last: bool = getattr(batch_sampler, "drop_last", False)
        if split_batches and (self.batch_size is None or self.batch_size % num_processes):
            raise ValueError(
                f"split_batches=True needs a batch sampler with a batch_size divisible by (a round multiple of) "
                f"the {num_processes} processes, got batch_size={self.batch_size} "
                f"({type(batch_sampler).__name__}); use split_batches=False for batches of varying size"
            )
        self.skip_batches = 0

    def _global_batches(self) -> int:
        return len(self.batch_sampler)

    def __len__(self) -> int:
        n = self._global_batches()
        if self.split_batches:
            return max(n - self.skip_batches - self._split_short(), 0)
        if self.drop_last:
            mine = n // self.num_processes
        elif self.even_batches:
            mine = math.ceil(n / self.num_processes)
        else:
            mine = n // self.num_processes + (1 if self.process_index < n % self.num_processes else 0)
        return max(mine - self.skip_batches, 0)

    def _split_short(self) -> int:
        # 1 when, without even_batches, this rank gets nothing of the last, short batch.
        if self.even_batches or self.drop_last or self.batch_size is None:
            return 0
        last = len(self.batch_sampler.sampler) % self.batch_size if hasattr(self.batch_sampler, "sampler") else 0
        return int(last > 0 and self.process_index * (self.batch_size // self.num_processes) >= last)

    def __iter__(self) -> Iterator[list[int]]:
        skip = self.skip_batches
        batches = self._split() if self.split_batches else self._deal()
        for i, batch in enumerate(batches):
            if i >= skip:
                yield batch

    def _deal(self) -> Iterator[list[int]]:
        n, rank = self.num_processes, self.process_index
        head: list[int] = []  # samples of the first round, used to fill the last one
        head_batches: list[list[int]] = []  # its whole batches (batch sizes that vary)
        round_: list[list[int]] = []
        for batch in self.batch_sampler:
            batch = list(batch)
            if self.batch_size is None:
                if len(head_batches) < n:
                    head_batches.append(batch)
            elif len(head) < n * self.batch_size:
                head.extend(batch)
            round_.append(batch)
            if len(round_) == n:
                if self.batch_size is None or len(round_[-1]) == self.batch_size:
                    yield round_[rank]
                    round_ = []
                else:
                    break
        if not round_ or self.drop_last:
            return
        if not self.even_batches or n == 1:  # one process: nothing to even out, as in the peer
            if rank < len(round_):
                yield round_[rank]
            return
        if self.batch_size is None:  # whole batches from the start of the epoch
            while len(round_) + len(head_batches) < n:
                head_batches = head_batches + head_batches
            yield (round_ + head_batches)[rank]
            return
        yield self._fill(round_, head)[rank]

    def _fill(self, round_: list[list[int]], head: list[int]) -> list[list[int]]:
        size = self.batch_size
        flat = [i for b in round_ for i in b]
        wanted = size * self.num_processes
        while len(head) < wanted:
            head = head + head
        flat += head[: wanted - len(flat)]
        return [flat[i * size : (i + 1) * size] for i in range(self.num_processes)]

    def _split(self) -> Iterator[list[int]]:
        n, rank, size = self.num_processes, self.process_index, self.batch_size
        part = size // n
        head: list[int] = []
        short: list[int] | None = None  # a batch shorter than batch_size: only the last may be
        for batch in self.batch_sampler:
            batch = list(batch)
            if short is not None or len(batch) > size:
                bad = short if short is not None else batch
                raise ValueError(
                    f"split_batches=True needs every batch but the last to hold batch_size={size} "
                    f"samples; {type(self.batch_sampler).__name__} gave one of {len(bad)} "
                    "(its samples would be lost); use split_batches=False for batches of varying size"
                )
            if not head:
                head = batch
            if len(batch) < size:
                short = batch
            else:
                yield batch[rank * part : (rank + 1) * part]
        if short is None:
            return
        if not self.even_batches or n == 1:
            mine = short[rank * part : (rank + 1) * part]
            if mine:
                yield mine
            return
        filler = head
        while len(filler) < size:
            filler = filler + filler
        batch = short + filler[: size - len(short)]
        yield batch[rank * part : (rank + 1) * part]
