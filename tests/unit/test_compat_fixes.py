"""Regression tests for the data/runtime bugs found by running the peer's test scripts (issue 12).

One process; ranks are simulated where sharding is concerned. The two-process halves
(sample order across ranks, non-shared checkpoint directories, max/min reductions)
are in ``test_compat_distributed.py``.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, TensorDataset

from notebook_accel import Accelerator
from notebook_accel.data.prepare import DataLoaderConfiguration, skip_first_batches
from notebook_accel.data.sharding import ShardBatchSampler
from notebook_accel.runtime.gradient_state import GradientState
from notebook_accel.runtime.ops import reduce
from notebook_accel.runtime.state import split_for_process


def values(loader) -> list[int]:
    return [int(v) for batch in loader for v in (batch[0] if isinstance(batch, (list, tuple)) else batch)]


# 1 -------------------------------------------------------------------------------------
def test_users_generator_is_kept_so_the_order_is_the_one_process_order():
    data = torch.arange(40)
    g = torch.Generator()
    plain = DataLoader(data, batch_size=4, shuffle=True, generator=g)
    prepared = Accelerator().prepare(DataLoader(data, batch_size=4, shuffle=True, generator=g))
    g.manual_seed(42)  # the user reseeds after prepare, as the peer's training_check does
    got = [values(prepared) for _ in range(2)]
    g.manual_seed(42)
    want = [values(plain) for _ in range(2)]
    assert got == want
    # and the position is still checkpointed: a restored state replays the rest of the epoch
    it = iter(prepared)
    next(it), next(it)
    state = prepared.state_dict()
    rest = [int(v) for b in it for v in b]
    prepared.load_state_dict(state)
    assert values(skip_first_batches(prepared)) == rest


# 2 -------------------------------------------------------------------------------------
def test_seedable_sampler_replays_the_shuffle_after_set_seed_and_set_epoch():
    from notebook_accel.data.samplers import SeedableRandomSampler
    from notebook_accel.runtime.seeding import set_seed

    set_seed(42)
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    loader = acc.prepare(DataLoader(torch.arange(30), batch_size=5, shuffle=True))
    assert isinstance(loader.batch_sampler.batch_sampler.sampler, SeedableRandomSampler)
    first = [values(loader) for _ in range(3)]
    assert first[0] != first[1]
    set_seed(42)
    loader.set_epoch(0)
    assert [values(loader) for _ in range(3)] == first
    loader.set_epoch(1)
    assert values(loader) == first[1]
    # the epoch travels with the checkpointed position
    it = iter(loader)  # epoch 2
    next(it)
    state = loader.state_dict()
    assert state["epoch"] == 2
    list(it)
    loader.load_state_dict(state)
    assert values(loader) == first[2]


def test_set_epoch_reaches_a_custom_batch_sampler():
    class EpochBatches:
        def __init__(self):
            self.epoch = -1

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            return iter([[0, 1], [2, 3]])

        def __len__(self):
            return 2

    sampler = EpochBatches()
    loader = Accelerator().prepare(DataLoader(torch.arange(4), batch_sampler=sampler))
    loader.set_epoch(5)
    assert sampler.epoch == 5


# 3 -------------------------------------------------------------------------------------
def test_split_batches_never_drops_samples_of_varying_batches():
    with pytest.raises(ValueError, match="batch_size"):
        ShardBatchSampler([[0, 1, 2], [3, 4, 5]], 2, 0, split_batches=True)

    class Uneven:  # says batch_size=4 but gives a short batch in the middle
        batch_size, drop_last = 4, False

        def __iter__(self):
            return iter([[0, 1, 2, 3], [4, 5], [6, 7, 8, 9]])

        def __len__(self):
            return 3

    with pytest.raises(ValueError, match="would be lost"):
        list(ShardBatchSampler(Uneven(), 2, 0, split_batches=True))


# 4 -------------------------------------------------------------------------------------
def test_a_batch_sampler_given_as_sampler_is_sharded():
    ds = TensorDataset(torch.arange(10))
    sampler = BatchSampler(SequentialSampler(range(10)), 4, False)
    loader = Accelerator().prepare(DataLoader(ds, batch_size=None, sampler=sampler))
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    from notebook_accel.data.prepare import shard_data_loader

    shards = [
        shard_data_loader(DataLoader(ds, batch_size=None, sampler=sampler), num_processes=2, process_index=r,
                          device=None, gradient_state=GradientState())
        for r in range(2)
    ]
    assert [[b[0].tolist() for b in s] for s in shards] == [[[0, 1, 2, 3], [8, 9, 0, 1]], [[4, 5, 6, 7], [2, 3, 4, 5]]]


# 5 -------------------------------------------------------------------------------------
def test_preparing_a_model_twice_registers_it_once(tmp_path):
    acc = Accelerator()
    model = torch.nn.Linear(2, 2)
    first = acc.prepare(model)
    assert acc.prepare(first) is first and acc.prepare(model) is first
    assert len(acc._models) == 1
    acc.save_state(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").exists() and not (tmp_path / "ckpt" / "model_1.safetensors").exists()


# 6 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batches", [
    [[0, 1, 2], [3, 4, 5], [6]],
    [[0], [1, 2], [3, 4, 5], [6, 7, 8, 9], [10]],
    [[0, 1]],
    [[0, 1], [2, 3, 4], [5], [6, 7], [8, 9, 10]],
])
@pytest.mark.parametrize("nproc", [2, 3])
def test_varying_batches_are_filled_with_whole_batches_like_the_peer(batches, nproc):
    peer = pytest.importorskip("accelerate.data_loader")
    for rank in range(nproc):
        theirs = list(peer.BatchSamplerShard(batches, nproc, rank, even_batches=True))
        ours = ShardBatchSampler(batches, nproc, rank, even_batches=True)
        assert list(ours) == theirs, (batches, nproc, rank)
        assert len(ours) == len(theirs)


# 8 -------------------------------------------------------------------------------------
def test_reduce_accepts_max_and_min():
    t = torch.tensor([1.0, 5.0])
    assert reduce(t, "max").tolist() == [1.0, 5.0] and reduce(t, "min", scale=2.0).tolist() == [2.0, 10.0]
    with pytest.raises(ValueError, match="'max'"):
        reduce(t, "median")


def test_split_between_processes_takes_any_sized_indexable():
    class Rows:  # what a datasets.Dataset offers: __len__, __getitem__ and select
        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]

        def select(self, indices):
            return Rows([self.rows[i] for i in indices])

    assert split_for_process(Rows(list("abc")), 1, 2).rows == ["c"]
    assert split_for_process(Rows(list("abc")), 1, 2, apply_padding=True).rows == ["c", "c"]

    class Plain(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return i * 10

    part = split_for_process(Plain(), 0, 2)
    assert [part[i] for i in range(len(part))] == [0, 10, 20]
    with pytest.raises(TypeError, match="sized indexable"):
        split_for_process(object(), 0, 2)


def test_register_for_checkpointing_lists_every_bad_object():
    acc = Accelerator()
    with pytest.raises(ValueError, match=r"Item at index 1 \(object\).*Item at index 2 \(int\)"):
        acc.register_for_checkpointing(torch.nn.Linear(1, 1), object(), 3)
    assert acc._custom_objects == []


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def test_skip_first_batches_takes_a_plain_loader():
    loaded = []

    class Counting(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            loaded.append(i)
            return i

    skipped = skip_first_batches(DataLoader(Counting(), batch_size=3), 2)
    assert [b.tolist() for b in skipped] == [[6, 7, 8], [9]] and len(skipped) == 2
    assert sorted(loaded) == [6, 7, 8, 9]  # skipped batches never loaded
    assert values(Accelerator().skip_first_batches(DataLoader(Stream(), batch_size=4), 1)) == [4, 5, 6, 7, 8, 9]


def test_join_warns_when_even_batches_cannot_be_overridden_for_an_iterable_loader():
    acc = Accelerator()
    acc.prepare(DataLoader(Stream(), batch_size=2))
    mapped = acc.prepare(DataLoader(torch.arange(4), batch_size=2))
    warns = pytest.warns(UserWarning, match="only supported for map-style datasets")
    with warns, acc.join_uneven_inputs([], even_batches=False):
        assert mapped.batch_sampler.even_batches is False
    assert mapped.batch_sampler.even_batches is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with acc.join_uneven_inputs([]):  # nothing overridden: no warning
            pass


def test_a_dropped_accelerator_is_freed_without_the_cycle_collector():
    import gc
    import weakref

    gc.disable()
    try:
        acc = Accelerator()
        loader = acc.prepare_data_loader(torch.utils.data.DataLoader(list(range(8)), batch_size=4))
        next(iter(loader))
        refs = weakref.ref(acc), weakref.ref(loader)
        del acc, loader
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()


def test_init_trackers_starts_a_custom_tracker_before_recording_the_config():
    from notebook_accel.tracking import GeneralTracker

    class Recorder(GeneralTracker):
        name = "recorder"

        def __init__(self):
            self.calls = []

        def start(self):
            self.calls.append("start")

        def store_init_configuration(self, values):
            self.calls.append(values)

    tracker = Recorder()
    Accelerator(log_with=tracker).init_trackers("run", {"lr": 0.1})
    assert tracker.calls == ["start", {"lr": 0.1}]


def test_version_checks_and_environment_purge(monkeypatch):
    from notebook_accel.utils import (
        compare_versions,
        is_torch_version,
        purge_accelerate_environment,
    )

    assert is_torch_version(">=", "2.2") and not is_torch_version("<", "2.2")
    assert compare_versions("2.1.0", "<", "2.10") and compare_versions("torch", ">=", "2.2")
    with pytest.raises(ValueError, match="operation must be one of"):
        compare_versions("torch", "=>", "2.0")
    monkeypatch.setenv("ACCELERATE_KEPT", "1")

    @purge_accelerate_environment
    def sets_variables():
        os.environ["ACCELERATE_NEW"] = "1"
        os.environ["ACCELERATE_KEPT"] = "2"

    sets_variables()
    assert "ACCELERATE_NEW" not in os.environ and os.environ["ACCELERATE_KEPT"] == "1"


def test_an_unbatched_iterable_loader_is_sharded_sample_by_sample():
    from notebook_accel.data_loader import prepare_data_loader

    class Numbers(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(torch.arange(6.0))

    shards = [[x.item() for x in prepare_data_loader(DataLoader(Numbers(), batch_size=None), num_processes=2,
                                                      process_index=rank)] for rank in (0, 1)]
    assert shards == [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
    with pytest.raises(ValueError, match="batch_size=None yields single samples"):
        prepare_data_loader(DataLoader(Numbers(), batch_size=None), num_processes=2, process_index=0,
                            split_batches=True)


def test_unwrap_undoes_a_forward_wrapped_by_hand_the_peers_way():
    import pickle

    from notebook_accel.utils import convert_outputs_to_fp32, extract_model_from_parallel

    model = torch.nn.Linear(1, 1)
    model._original_forward = model.forward
    model.forward = convert_outputs_to_fp32(model.forward)
    model = extract_model_from_parallel(model, keep_fp32_wrapper=False)
    assert "forward" not in model.__dict__ and "_original_forward" not in model.__dict__
    pickle.dumps(model)


def test_a_registered_tracker_class_is_used_by_its_name(tmp_path):
    from notebook_accel.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker, register_tracker_class

    class Notes(GeneralTracker):
        name = "notes"
        requires_logging_directory = True

        def __init__(self, run_name, logging_dir):
            self.where = (run_name, logging_dir)

    saved = dict(LOGGER_TYPE_TO_CLASS)
    try:
        register_tracker_class(Notes)
        with pytest.raises(ValueError, match="log_with='notes' needs a logging directory"):
            Accelerator(log_with="notes")
        acc = Accelerator(log_with="notes", project_dir=tmp_path)
        acc.init_trackers("run")
        assert acc.get_tracker("notes").where == ("run", tmp_path)
        with pytest.raises(ValueError, match="GeneralTracker subclass"):
            register_tracker_class(dict)
    finally:
        LOGGER_TYPE_TO_CLASS.clear()
        LOGGER_TYPE_TO_CLASS.update(saved)


@pytest.mark.parametrize("dispatch", [True, False])
def test_skip_first_batches_keeps_the_loader_kind(dispatch):
    from notebook_accel.data_loader import DataLoaderDispatcher, skip_first_batches

    acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=dispatch))
    loader = acc.prepare(DataLoader(list(range(16)), batch_size=4))
    loader.set_epoch(3)
    rest = skip_first_batches(loader, 2)
    assert isinstance(rest, DataLoaderDispatcher) == dispatch and rest.iteration == 3
    assert [b.tolist() for b in rest] == [[8, 9, 10, 11], [12, 13, 14, 15]]


def test_load_checkpoint_in_model_reads_a_bare_index_in_a_folder(tmp_path):
    import json

    from notebook_accel.utils import load_checkpoint_in_model

    source = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    index = {}
    for part in ("0", "1"):
        tensors = {k: v for k, v in source.state_dict().items() if k.startswith(part)}
        torch.save(tensors, tmp_path / f"part{part}.bin")
        index.update(dict.fromkeys(tensors, f"part{part}.bin"))
    (tmp_path / "weights.index.json").write_text(json.dumps(index))  # the map alone, no "weight_map"
    target = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    load_checkpoint_in_model(target, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values(), strict=True))


def test_accelerate_torch_device_overrides_the_device(monkeypatch):
    from notebook_accel import PartialState

    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu:3")
    assert Accelerator().device == torch.device("cpu:3")
    assert PartialState(cpu=True).device == torch.device("cpu")
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "meta")
    with pytest.raises(ValueError, match="ACCELERATE_TORCH_DEVICE='meta' is a meta device"):
        PartialState()
