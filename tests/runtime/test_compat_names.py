"""The peer's names and options that users switching reach for (issue 12), one process."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import notebook_accel
from notebook_accel import Accelerator, DistributedType
from notebook_accel import utils as nu


def test_top_level_and_utils_names_resolve_to_our_objects():
    for name in ("AcceleratorState", "GradientAccumulationPlugin", "KwargsHandler", "synchronize_rng_states",
                 "SeedableRandomSampler", "DataLoaderDispatcher", "SkipDataLoader", "SkipBatchSampler",
                 "BatchSamplerShard", "prepare_data_loader", "debug_launcher"):
        assert getattr(notebook_accel, name).__module__.startswith("notebook_accel"), name
    for name in nu.__all__:
        value = getattr(nu, name)
        assert isinstance(value, (str, tuple)) or value.__module__.startswith("notebook_accel"), name  # or a constant
    acc = Accelerator()
    assert isinstance(acc.state, notebook_accel.AcceleratorState) and acc.state.mixed_precision == "no"
    notebook_accel.AcceleratorState._reset_state()  # nothing shared to reset: acc keeps working
    assert acc.prepare(torch.nn.Linear(1, 1)) is not None


def test_kwargs_handler_gives_only_changed_fields_and_the_plugin_drives_accumulation():
    from dataclasses import dataclass

    @dataclass
    class Mine(nu.KwargsHandler):
        a: int = 1
        b: bool = False

    assert Mine(b=True).to_kwargs() == {"b": True}
    assert nu.DistributedDataParallelKwargs(find_unused_parameters=True).to_kwargs() == {"find_unused_parameters": True}
    acc = Accelerator(gradient_accumulation_plugin=nu.GradientAccumulationPlugin(num_steps=3, sync_each_batch=True))
    assert acc.gradient_accumulation_steps == 3 and acc.sync_each_batch
    with pytest.raises(ValueError, match="num_steps"):
        nu.GradientAccumulationPlugin(num_steps=0)


def test_unsupported_distributed_types_exist_and_say_so_when_chosen():
    assert {"FSDP", "DEEPSPEED", "MEGATRON_LM", "MULTI_XPU", "MULTI_NPU", "MULTI_HPU"} <= set(DistributedType.__members__)
    acc = Accelerator()
    acc.state.distributed_type = DistributedType.MEGATRON_LM
    with pytest.raises(NotImplementedError, match="MEGATRON_LM is not supported.*DEEPSPEED"):
        acc.prepare(torch.nn.Linear(1, 1))


def test_environment_helpers():
    os.environ.pop("NA_TEST_VAR", None)
    with nu.patch_environment(na_test_var=3):
        assert os.environ["NA_TEST_VAR"] == "3"
        with nu.clear_environment():
            assert os.environ == {}
        assert os.environ["NA_TEST_VAR"] == "3"
    assert "NA_TEST_VAR" not in os.environ
    assert nu.str_to_bool("Yes") == 1 and nu.str_to_bool("off") == 0
    with pytest.raises(ValueError, match="'maybe'"):
        nu.str_to_bool("maybe")


def test_structure_helpers():
    data = {"a": torch.tensor([1, 2]), "b": [torch.tensor([[3]])]}
    assert nu.listify(data) == {"a": [1, 2], "b": [[[3]]]}
    both = nu.concatenate([data, data])
    assert both["a"].tolist() == [1, 2, 1, 2] and both["b"][0].shape == (2, 1)
    assert nu.find_device(data) == torch.device("cpu") and nu.find_batch_size(data) == 2
    assert nu.pad_input_tensors(torch.ones(7, 2), 7, 4).shape == (8, 2)
    assert nu.pad_input_tensors(torch.ones(3), 3, 2).tolist() == [1, 1, 1, 0]

    @nu.convert_outputs_to_fp32
    def forward(x):
        return {"y": x.half()}

    assert forward(torch.ones(1))["y"].dtype == torch.float32


def test_unwrap_model_and_extract_model_from_parallel_handle_compile():
    acc = Accelerator()
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model)
    assert acc.unwrap_model(compiled) is compiled  # keep_torch_compile=True: the peer's default
    assert acc.unwrap_model(compiled, keep_torch_compile=False) is model
    assert nu.extract_model_from_parallel(torch.nn.DataParallel(model)) is model


def test_save_model_in_shards_and_save_state_as_safetensors(tmp_path):
    from safetensors.torch import load_file

    acc = Accelerator()
    model = acc.prepare(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)))
    index = acc.save_model(model, tmp_path / "m", max_shard_size="20KB")
    mapping = json.loads(index.read_text())["weight_map"]
    files = sorted(set(mapping.values()))
    assert index.name == "model.safetensors.index.json" and len(files) >= 2
    merged = {k: v for f in files for k, v in load_file(str(tmp_path / "m" / f)).items()}
    assert all(torch.equal(merged[k], v) for k, v in model.state_dict().items())
    assert acc.save_model(model, tmp_path / "one").name == "model.safetensors"
    with pytest.raises(ValueError, match="'ten'"):
        acc.save_model(model, tmp_path / "bad", max_shard_size="ten")

    before = [p.detach().clone() for p in model.parameters()]
    acc.save_state(tmp_path / "ckpt", safe_serialization=True)
    assert (tmp_path / "ckpt" / "model.safetensors").is_file() and not (tmp_path / "ckpt" / "pytorch_model.bin").exists()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    acc.load_state(tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_save_and_load_state_pre_hooks(tmp_path):
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(1, 1))
    seen = []

    def skip_models(models, weights, output_dir):
        seen.append((len(models), len(weights), output_dir))
        models.clear()
        weights.clear()

    handle = acc.register_save_state_pre_hook(skip_models)
    acc.save_state(tmp_path / "a")
    assert seen == [(1, 1, tmp_path / "a")] and not (tmp_path / "a" / "model.safetensors").exists()
    handle.remove()
    acc.save_state(tmp_path / "b")
    assert (tmp_path / "b" / "model.safetensors").is_file() and len(seen) == 1

    loads = []
    acc.register_load_state_pre_hook(lambda models, input_dir: (loads.append(input_dir), models.clear()))
    acc.load_state(tmp_path / "a")  # the hook took the model out: no model file needed
    assert loads == [tmp_path / "a"]
    del model


def test_peer_prepare_data_loader_signature_and_skip_classes():
    from notebook_accel import SkipBatchSampler, SkipDataLoader, prepare_data_loader

    dl = DataLoader(range(16), batch_size=4)
    shard = prepare_data_loader(dl, torch.device("cpu"), 2, 1, put_on_device=True)
    assert [b.tolist() for b in shard] == [[4, 5, 6, 7], [12, 13, 14, 15]]
    assert [b.tolist() for b in prepare_data_loader(dataloader=dl, split_batches=True)] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    with pytest.raises(ValueError, match="rng_types"):
        prepare_data_loader(dl, rng_types=["cuda"])
    assert [b.tolist() for b in SkipDataLoader(range(6), skip_batches=1, batch_size=2)] == [[2, 3], [4, 5]]
    assert list(SkipBatchSampler([[0], [1], [2]], 2)) == [[2]]


def test_dispatch_batches_on_one_process_yields_the_loader_batches():
    from notebook_accel.data.dispatch import DataLoaderDispatcher
    from notebook_accel.data.prepare import DataLoaderConfiguration

    acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=4))
    assert isinstance(loader, DataLoaderDispatcher) and len(loader) == 3
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_launcher_options():
    from notebook_accel import notebook_launcher

    with pytest.raises(ValueError, match="monitor_interval"):
        notebook_launcher(print, num_processes=1, monitor_interval=0)


def _put_rank(queue):
    from notebook_accel import PartialState

    queue.put(PartialState().process_index)
    queue.close()
    queue.join_thread()  # flushed before the worker exits


def test_forked_workers_inherit_what_cannot_be_pickled_others_are_told():
    import multiprocessing
    import threading

    from notebook_accel import notebook_launcher

    queue = multiprocessing.get_context("fork").Queue()
    notebook_launcher(_put_rank, (queue,), num_processes=2, start_method="fork")
    assert sorted(queue.get(timeout=10) for _ in range(2)) == [0, 1]
    with pytest.raises(TypeError, match=r"cannot send args\[0\]"):
        notebook_launcher(_put_rank, (queue,), num_processes=2, start_method="spawn")
    with pytest.raises(TypeError, match=r"cannot send args\[0\]"):  # still named before any worker starts
        notebook_launcher(_put_rank, (threading.Lock(),), num_processes=2, start_method="fork")


def _world():
    from notebook_accel import PartialState

    state = PartialState()
    return state.num_processes, state.device.type


def test_debug_launcher_runs_on_cpu_processes():
    from notebook_accel import debug_launcher

    assert debug_launcher(_world, num_processes=2) == (2, "cpu")


def test_dispatcher_forwards_set_epoch_to_a_seedable_sampler():
    from notebook_accel.data.prepare import DataLoaderConfiguration
    from notebook_accel.runtime.seeding import set_seed

    set_seed(1)
    config = DataLoaderConfiguration(dispatch_batches=True, use_seedable_sampler=True)
    loader = Accelerator(dataloader_config=config).prepare(DataLoader(torch.arange(12), batch_size=4, shuffle=True))
    first = [b.tolist() for b in loader]
    loader.set_epoch(0)
    assert [b.tolist() for b in loader] == first
