"""Data loader sharding, shuffling, position and skipping (one process; ranks simulated)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, TensorDataset

from notebook_accel import Accelerator
from notebook_accel.data.iterable import IterableDatasetShard
from notebook_accel.data.prepare import DataLoaderShard, skip_first_batches
from notebook_accel.data.sharding import ShardBatchSampler

GRID = [
    (n, bs, nproc, split, even, drop)
    for n, bs, nproc in itertools.product((1, 5, 16, 17, 101), (1, 4, 8), (2, 3))
    for split, even, drop in itertools.product((False, True), repeat=3)
    if not (split and bs % nproc)
]


@pytest.mark.parametrize(("n", "bs", "nproc", "split", "even", "drop"), GRID)
def test_shards_cover_the_data_and_agree_with_len(n, bs, nproc, split, even, drop):
    sampler = BatchSampler(SequentialSampler(range(n)), bs, drop)
    shards = [ShardBatchSampler(sampler, nproc, r, split, even) for r in range(nproc)]
    batches = [list(s) for s in shards]
    for shard, mine in zip(shards, batches, strict=True):
        assert len(shard) == len(mine)
    seen = {i for mine in batches for b in mine for i in b}
    if not drop:
        assert seen == set(range(n))  # nothing lost
    if even and not drop:
        assert len({len(mine) for mine in batches}) == 1  # same count everywhere
        per = bs // nproc if split else bs
        assert all(len(b) == per for mine in batches for b in mine)
    if not even:
        flat = sorted(i for mine in batches for b in mine for i in b)
        assert flat == sorted(set(flat))  # no duplicates without even_batches


def test_batch_level_sharding_takes_every_nth_batch():
    sampler = BatchSampler(SequentialSampler(range(12)), 2, False)
    assert list(ShardBatchSampler(sampler, 2, 1)) == [[2, 3], [6, 7], [10, 11]]
    assert list(ShardBatchSampler(sampler, 2, 0, split_batches=True)) == [[0], [2], [4], [6], [8], [10]]
    with pytest.raises(ValueError, match="divisible"):
        ShardBatchSampler(BatchSampler(SequentialSampler(range(12)), 3, False), 2, 0, split_batches=True)


def test_matches_the_peer_batch_sampler_shard():
    peer = pytest.importorskip("accelerate.data_loader")
    for n, bs, nproc, split, even, drop in GRID:
        sampler = BatchSampler(SequentialSampler(range(n)), bs, drop)
        for r in range(nproc):
            theirs = list(peer.BatchSamplerShard(sampler, nproc, r, split_batches=split, even_batches=even))
            assert list(ShardBatchSampler(sampler, nproc, r, split, even)) == theirs, (n, bs, nproc, split, even, drop, r)


def test_prepared_loader_flags_end_and_remainder_and_moves_batches():
    acc = Accelerator()
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4))
    assert loader.total_batch_size == 4 and loader.remainder == 2 and len(loader) == 3
    ends = []
    for (x,) in loader:
        assert x.device == acc.device
        assert acc.gradient_state.in_dataloader
        ends.append(acc.gradient_state.end_of_dataloader)
    assert ends == [False, False, True]
    assert not acc.gradient_state.in_dataloader


def test_shuffling_is_seeded_and_differs_between_epochs():
    def orders():
        torch.manual_seed(5)
        loader = Accelerator().prepare(DataLoader(TensorDataset(torch.arange(20)), batch_size=5, shuffle=True))
        return [[int(v) for (x,) in loader for v in x] for _ in range(2)]

    first, again = orders(), orders()
    assert first == again
    assert first[0] != first[1] and sorted(first[0]) == list(range(20))


def test_data_seed_fixes_the_shuffle():
    from notebook_accel.accelerator import DataLoaderConfiguration

    def order(seed):
        torch.manual_seed(seed)  # ignored once data_seed is given
        acc = Accelerator(dataloader_config=DataLoaderConfiguration(data_seed=3, use_seedable_sampler=True))
        return [int(v) for x in acc.prepare(DataLoader(torch.arange(10), batch_size=5, shuffle=True)) for v in x]

    assert order(1) == order(2)


class CountingDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n, self.loaded = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.loaded.append(i)
        return i


def test_state_dict_and_skip_first_batches_resume_mid_epoch_without_loading_skipped():
    torch.manual_seed(0)
    acc = Accelerator()
    ds = CountingDataset(24)
    loader = acc.prepare(DataLoader(ds, batch_size=4, shuffle=True))
    it = iter(loader)
    done = [next(it).tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [b.tolist() for b in it]
    assert state["batches_yielded"] == 2
    next_epoch = [b.tolist() for b in loader]

    loader.load_state_dict(state)
    assert loader.resume_step == 2
    ds.loaded.clear()
    skipped = acc.skip_first_batches(loader)
    assert len(skipped) == 4
    assert [b.tolist() for b in skipped] == rest
    assert sorted(ds.loaded) == sorted(i for b in rest for i in b)  # skipped batches never loaded
    assert [b.tolist() for b in loader] == next_epoch  # shared generator continues correctly
    assert loader.state_dict()["batches_yielded"] == 0  # a finished epoch
    assert done != rest


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize(("n", "bs", "nproc", "split", "drop"), [
    (n, bs, nproc, split, drop)
    for n, bs, nproc, split, drop in itertools.product((1, 7, 16, 17, 101), (2, 4), (2, 3), (False, True), (False, True))
    if not (split and bs % nproc)
])
def test_iterable_shards_match_the_peer(n, bs, nproc, split, drop):
    peer = pytest.importorskip("accelerate.data_loader")
    for r in range(nproc):
        ours = IterableDatasetShard(Stream(n), bs, drop, nproc, r, split)
        theirs = peer.IterableDatasetShard(Stream(n), bs, drop, nproc, r, split_batches=split)
        assert list(ours) == list(theirs)


def test_iterable_loader_gathers_exactly_with_unknown_length():
    acc = Accelerator()
    loader = acc.prepare(DataLoader(Stream(10), batch_size=4))
    got = [acc.gather_for_metrics(x).tolist() for x in loader]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert loader.remainder == 2 and loader.total_batch_size == 4
    skipped = acc.skip_first_batches(loader, 2)
    assert [x.tolist() for x in skipped] == [[8, 9, 0, 1]]
    with pytest.raises(ValueError, match="divisible"):
        IterableDatasetShard(Stream(4), 3, False, 2, 0, split_batches=True)


class NoisyDataset(Dataset):
    """Each sample draws from torch's RNG, which in a loader worker is seeded by the loader."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.rand(1) + i


@pytest.mark.parametrize("iterable", [False, True])
def test_stateful_loader_resumes_by_itself_after_load_state(iterable):
    """torchdata's StatefulDataLoader under ours, as in the peer: its state, its resume, its length (the
    whole epoch's, as the peer's)."""
    pytest.importorskip("torchdata.stateful_dataloader")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from notebook_accel.accelerator import DataLoaderConfiguration

    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    source = Stream(22) if iterable else CountingDataset(22)

    def make():
        torch.manual_seed(0)
        acc = Accelerator(dataloader_config=config)
        return acc.prepare(DataLoader(source, batch_size=4, shuffle=not iterable))

    loader = make()
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader, DataLoaderShard)
    it = iter(loader)
    [next(it) for _ in range(2)]
    state = loader.state_dict()
    assert state["_num_yielded"] == 2  # torchdata's own keys
    rest = [b.tolist() for b in it]
    following = [b.tolist() for b in loader]

    fresh = make()
    fresh.load_state_dict(state)
    assert iterable or len(fresh) == len(rest) + 2 == 6  # a stream has no length
    assert [b.tolist() for b in fresh] == rest  # resumed mid-epoch without skip_first_batches
    assert [b.tolist() for b in fresh] == following
    by_hand = make()
    by_hand.load_state_dict(state)
    assert [b.tolist() for b in skip_first_batches(by_hand)] == rest
    assert [b.tolist() for b in by_hand] == following  # resumed by hand: not skipped twice


def test_use_stateful_dataloader_gives_a_stateful_loader_in_every_path():
    """prepare (sharded, iterable, dispatched), the loaders built directly, prepare_data_loader and
    skip_first_batches of each: a torchdata StatefulDataLoader."""
    pytest.importorskip("torchdata.stateful_dataloader")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from notebook_accel.accelerator import DataLoaderConfiguration
    from notebook_accel.data_loader import DataLoaderDispatcher, prepare_data_loader

    data = list(range(10))
    loaders = {
        "prepare": Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)).prepare(
            DataLoader(data, batch_size=2)),
        "prepare, iterable": Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        .prepare(DataLoader(Stream(10), batch_size=2)),
        "prepare, dispatched": Accelerator(dataloader_config=DataLoaderConfiguration(
            use_stateful_dataloader=True, dispatch_batches=True)).prepare(DataLoader(data, batch_size=2)),
        "DataLoaderShard": DataLoaderShard(data, batch_size=2, use_stateful_dataloader=True),
        "DataLoaderDispatcher": DataLoaderDispatcher(data, batch_size=2, use_stateful_dataloader=True),
        "prepare_data_loader": prepare_data_loader(DataLoader(data, batch_size=2), use_stateful_dataloader=True),
    }
    for name, loader in loaders.items():
        assert isinstance(loader, StatefulDataLoader), name
        skipped = skip_first_batches(loader, 2)
        assert isinstance(skipped, StatefulDataLoader) and skipped.use_stateful_dataloader, name
        it = iter(skipped)
        assert next(it).tolist() == [4, 5], name
        assert "_num_yielded" in skipped.state_dict(), name  # torchdata's own state


def test_a_stateful_loader_without_torchdata_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)  # as if torchdata were absent
    monkeypatch.delitem(sys.modules, "notebook_accel.data.stateful", raising=False)
    with pytest.raises(ImportError, match=r"notebook-accel\[stateful\]"):
        DataLoaderShard(list(range(8)), batch_size=4, use_stateful_dataloader=True)


def test_our_loaders_are_their_own_base_dataloader_and_carry_the_peers_bases():
    from torch.utils.data import DataLoader

    from notebook_accel.data_loader import (
        DataLoaderAdapter,
        DataLoaderDispatcher,
        DataLoaderShard,
        DataLoaderStateMixin,
        SkipDataLoader,
    )

    shard, skip = DataLoaderShard(range(8), batch_size=4), SkipDataLoader(range(8), batch_size=4, skip_batches=1)
    assert shard.base_dataloader is shard and skip.base_dataloader is skip
    assert isinstance(shard, DataLoaderAdapter) and isinstance(shard, DataLoaderStateMixin)
    assert isinstance(DataLoaderDispatcher(range(8), batch_size=4), DataLoaderStateMixin)
    assert not hasattr(DataLoaderShard, "base_dataloader")
    seen = []
    for _ in shard:
        seen.append((shard.end_of_dataloader, shard.gradient_state.active_dataloader is shard))
    assert seen == [(False, True), (True, True)] and shard.gradient_state.active_dataloader is None
    assert isinstance(skip, DataLoader) and [b.tolist() for b in skip] == [[4, 5, 6, 7]]
