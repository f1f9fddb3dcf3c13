"""The peer's names and parameters that a user switching from Accelerate relies on (issue 33):
``InitProcessGroupKwargs``, the ``accelerate.utils`` helpers (``is_namedtuple``, ``honor_type`` and
the peer's words for an unsupported leaf, a nested tensor not padded, ``save`` of tensors sharing
memory, ``check_os_kernel``, ``convert_dict_to_env_variables``, ``get_model_tp_size``,
``has_offloaded_params``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notebook_accel import Accelerator, InitProcessGroupKwargs
from notebook_accel.runtime import state as state_module

ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "NOTEBOOK_ACCEL_DEVICE", "ACCELERATE_TORCH_DEVICE")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def groups_made(monkeypatch):
    """Rank 0 of 2; the process group that would be created is recorded instead."""
    made = []
    monkeypatch.setattr(state_module, "ensure_process_group", lambda *args, **kwargs: made.append((args, kwargs)))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("NOTEBOOK_ACCEL_DEVICE", "cpu")
    return made


def test_init_process_group_kwargs_reach_the_process_group(groups_made):
    handler = InitProcessGroupKwargs(timeout=timedelta(seconds=7), init_method="tcp://127.0.0.1:1")
    Accelerator(kwargs_handlers=[handler])
    (backend, rank, world, timeout, _device), kwargs = groups_made[-1]
    assert (backend, rank, world, timeout) == ("gloo", 0, 2, timedelta(seconds=7))
    assert kwargs["init_method"] == "tcp://127.0.0.1:1"


def test_the_default_nccl_backend_means_the_devices_own_and_another_is_used_as_given(groups_made):
    assert InitProcessGroupKwargs().to_kwargs() == {}
    Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="nccl")])
    assert groups_made[-1][0][0] == "gloo"  # on the CPU
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="mpi")])
    assert groups_made[-1][0][0] == "mpi" == accelerator.state.backend


def test_the_peers_own_handler_is_understood(groups_made):
    peer = pytest.importorskip("accelerate.utils")
    Accelerator(kwargs_handlers=[peer.InitProcessGroupKwargs(timeout=timedelta(seconds=3))])
    assert groups_made[-1][0][3] == timedelta(seconds=3)


def test_namedtuples_of_every_kind_keep_their_type_and_other_leaves_are_named_as_the_peer_does():
    from collections import namedtuple
    from typing import NamedTuple

    import torch

    from notebook_accel.utils import honor_type, is_namedtuple, recursively_apply

    class Base(NamedTuple):
        value: torch.Tensor
        scale: torch.Tensor | None

    class Second(Base):
        pass

    point = namedtuple("Point", "x y")(1, 2)
    assert all(map(is_namedtuple, (Base(torch.ones(1), None), Second(torch.ones(1), None), point)))
    assert not any(map(is_namedtuple, ((1, 2), "hey", object())))
    assert honor_type(point, iter((3, 4))) == (3, 4) and type(honor_type(point, iter((3, 4)))) is type(point)
    doubled = recursively_apply(lambda t, k: t * k, Second(torch.ones(1), None), 2)
    assert type(doubled) is Second and doubled.value.item() == 2.0
    with pytest.raises(TypeError) as error:
        recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert str(error.value) == ("Unsupported types (<class 'int'>) passed to `tensor`. Only nested list/tuple/dicts "
                                "of objects that are valid for `is_torch_tensor` should be passed.")


def test_a_nested_tensor_is_returned_unpadded_with_a_warning():
    import torch

    from notebook_accel.utils import CannotPadNestedTensorWarning, pad_across_processes

    nested = torch.nested.nested_tensor([torch.ones(3), torch.ones(1)])
    with pytest.warns(CannotPadNestedTensorWarning):
        assert pad_across_processes({"a": nested})["a"] is nested
    plain = torch.ones(4, 3)
    assert pad_across_processes(plain, dim=-4) is plain


def test_save_stores_tensors_sharing_memory_once_saying_which(tmp_path, caplog):
    import torch
    from safetensors.torch import load_file

    from notebook_accel.utils import save

    model = torch.nn.Module()
    model.a = torch.nn.Linear(3, 3)
    model.b = model.a
    with caplog.at_level("WARNING"):
        save(model.state_dict(), tmp_path / "model.safetensors", safe_serialization=True)
    assert [r for r in caplog.records if "Removed shared tensor ['b.weight', 'b.bias']" in r.getMessage()]
    assert sorted(load_file(tmp_path / "model.safetensors")) == ["a.bias", "a.weight"]
    save({"x": torch.ones(2)}, tmp_path / "x.pt")
    assert torch.load(tmp_path / "x.pt")["x"].sum() == 2


def test_save_writes_on_the_main_process_only_or_each_machines_with_save_on_each_node(tmp_path, monkeypatch):
    import torch

    from notebook_accel.utils import save

    monkeypatch.setattr(state_module, "ensure_process_group", lambda *args, **kwargs: None)
    for name, value in {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "NOTEBOOK_ACCEL_DEVICE": "cpu"}.items():
        monkeypatch.setenv(name, value)
    save({"x": torch.ones(1)}, tmp_path / "main.pt")
    save({"x": torch.ones(1)}, tmp_path / "node.pt", save_on_each_node=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.pt"]


def test_check_os_kernel_warns_below_linux_5_5_only(monkeypatch, caplog):
    import platform
    from types import SimpleNamespace

    from notebook_accel.utils import check_os_kernel

    for system, release, warned in (("Linux", "5.15.0-35-generic", False), ("Darwin", "5.4.0", False),
                                    ("Linux", "5.4.0-35-generic", True)):
        monkeypatch.setattr(platform, "uname", lambda s=system, r=release: SimpleNamespace(system=s, release=r))
        caplog.clear()
        with caplog.at_level("WARNING"):
            check_os_kernel()
        messages = [r.getMessage() for r in caplog.records]
        assert bool(messages) == warned and all("5.4.0" in m and "5.5.0" in m for m in messages)
    caplog.clear()
    with caplog.at_level("WARNING"):
        Accelerator()  # checks it as the peer's does
    assert any("5.5.0" in r.getMessage() for r in caplog.records)


def test_convert_dict_to_env_variables_leaves_out_unsafe_values(caplog):
    from notebook_accel.utils import convert_dict_to_env_variables

    env = {"ACCELERATE_DEBUG_MODE": "1", "BAD_ENV_NAME": "<mything", "OTHER_ENV": "2", "EMPTY": ""}
    with caplog.at_level("WARNING"):
        assert convert_dict_to_env_variables(env) == ["ACCELERATE_DEBUG_MODE=1\n", "OTHER_ENV=2\n"]
    assert len(caplog.records) == 2 and "BAD_ENV_NAME" in caplog.records[0].getMessage()


def test_get_model_tp_size_reads_transformers_four_and_five():
    from types import SimpleNamespace

    from notebook_accel.utils import get_model_tp_size

    model = SimpleNamespace()
    assert get_model_tp_size(model) is None
    model.tp_size = 2
    assert get_model_tp_size(model) == 2
    model.tp_size, model.config = None, SimpleNamespace(distributed_config=SimpleNamespace(tp_size=4))
    assert get_model_tp_size(model) == 4
    model.config = SimpleNamespace(distributed_config={"tp_size": 8})
    assert get_model_tp_size(model) == 8


def test_has_offloaded_params_is_true_while_a_modules_weights_live_elsewhere(tmp_path):
    import torch

    from notebook_accel import cpu_offload, disk_offload, undispatch_model
    from notebook_accel.utils import has_offloaded_params

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert not has_offloaded_params(model[0])
    cpu_offload(model, execution_device=torch.device("cpu"))  # executed where they are: nothing offloaded
    assert not has_offloaded_params(model[0])
    undispatch_model(model)
    disk_offload(model, tmp_path, execution_device=torch.device("cpu"))
    assert has_offloaded_params(model[0]) and has_offloaded_params(model[1]) and not has_offloaded_params(model)
    undispatch_model(model)
    assert not has_offloaded_params(model[0])


def test_a_datasets_stream_with_a_shard_per_process_is_cut_by_datasets_each_rank_reading_its_own():
    datasets = pytest.importorskip("datasets")
    from torch.utils.data import DataLoader

    from notebook_accel.data.iterable import IterableDatasetShard
    from notebook_accel.data_loader import prepare_data_loader

    def batches(num_shards, rank, **kwargs):
        stream = datasets.Dataset.from_dict({"x": list(range(10))}).to_iterable_dataset(num_shards=num_shards)
        loader = prepare_data_loader(DataLoader(stream, batch_size=4), num_processes=2, process_index=rank,
                                     dispatch_batches=False, **kwargs)
        return loader, [b["x"].tolist() for b in loader]

    (loader, rank0), (_, rank1) = batches(2, 0), batches(2, 1)
    assert not isinstance(loader.dataset, IterableDatasetShard) and loader.total_batch_size == 8
    assert (rank0, rank1) == ([[0, 1, 2, 3], [4]], [[5, 6, 7, 8], [9]])
    loader, rank0 = batches(1, 0)  # fewer shards than processes: every rank reads all, keeps its slice
    assert isinstance(loader.dataset, IterableDatasetShard) and rank0 == [[0, 1, 2, 3], [8, 9, 0, 1]]
    loader, _ = batches(2, 0, split_batches=True)
    assert isinstance(loader.dataset, IterableDatasetShard)


def test_gradient_state_and_accelerator_state_without_arguments_are_the_latest_accelerators():
    import gc

    from notebook_accel import AcceleratorState, GradientState, PartialState

    GradientState._reset_state()
    AcceleratorState._reset_state()
    assert GradientState._shared_state == {} and AcceleratorState._shared_state == {}
    alone = GradientState()
    assert GradientState() is alone  # no Accelerator: the first built without arguments, as the peer's singleton
    assert GradientState._shared_state["num_steps"] == 1  # the peer's dict, a read-only view
    with pytest.raises(TypeError):
        GradientState._shared_state["num_steps"] = 2
    first = Accelerator(mixed_precision="bf16")
    assert GradientState() is not alone and PartialState._shared_state["device"] == first.device
    state = GradientState()
    assert state is first.gradient_state and state.num_steps == 1
    first.gradient_accumulation_steps = 4  # the peer's test_mutable_states
    first.sync_gradients = False
    assert state.num_steps == 4 and state.sync_gradients is False
    assert AcceleratorState() is first.state and AcceleratorState().mixed_precision == "bf16"
    assert GradientState(2).num_steps == 2 and GradientState(2) is not state  # arguments: a new one
    second = Accelerator()
    assert GradientState() is second.gradient_state and first.gradient_accumulation_steps == 4  # independent
    assert AcceleratorState._shared_state["mixed_precision"] == "no"  # the latest Accelerator's (second)
    GradientState._reset_state()
    AcceleratorState._reset_state(True)
    assert PartialState._shared_state == {} and AcceleratorState._shared_state == {}
    assert GradientState() is not second.gradient_state and AcceleratorState() is not second.state
    assert second.prepare(__import__("torch").nn.Linear(1, 1)) is not None  # a reset breaks nothing
    second_state = second.gradient_state
    GradientState.adopt(second_state)
    del first, second, state, second_state
    gc.collect()
    assert GradientState.latest() is None  # held weakly: a finished Accelerator's state is freed


def test_preload_module_classes_brings_a_submodules_weights_that_are_read_without_calling_it(tmp_path):
    import torch

    from notebook_accel import disk_offload, undispatch_model

    class ReadsItsChild(torch.nn.Module):  # uses linear's weights, never calls linear
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.nn.functional.linear(x, self.linear.weight, self.linear.bias)

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(3, 3), ReadsItsChild())

    x = torch.ones(1, 3)
    expected = model()(x)
    offloaded = disk_offload(model(), tmp_path / "a", execution_device=torch.device("cpu"))
    with pytest.raises(Exception):  # noqa: B017  (its child's weights are still on the meta device)
        offloaded(x)
    undispatch_model(offloaded)
    preloaded = disk_offload(model(), tmp_path / "b", execution_device=torch.device("cpu"),
                             preload_module_classes=["ReadsItsChild"])
    assert torch.allclose(preloaded(x), expected)
    assert preloaded[1].linear.weight.is_meta  # dropped again after the forward


def test_load_checkpoint_in_model_takes_the_peers_parameters_and_logs_unused_weights(tmp_path, caplog):
    import torch

    from notebook_accel import load_checkpoint_in_model

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))

    state = {**model().state_dict(), "foo": torch.ones(1)}
    torch.save(state, tmp_path / "w.pt")
    loaded = model()
    with caplog.at_level("WARNING"):
        load_checkpoint_in_model(loaded, tmp_path / "w.pt", offload_state_dict=True, dtype=torch.float16,
                                 keep_in_fp32_modules=["1"])
    assert any("were not used when initializing Sequential: foo" in r.getMessage() for r in caplog.records)
    assert loaded[0].weight.dtype == torch.float16 and loaded[1][0].weight.dtype == torch.float32
    assert torch.equal(loaded[1][0].weight, state["1.0.weight"])
    with pytest.raises(ValueError, match="unexpected"):
        load_checkpoint_in_model(model(), tmp_path / "w.pt", strict=True)


def test_the_peers_rendezvous_arguments_become_our_meeting_point():
    from notebook_accel import notebook_launcher
    from notebook_accel.launch.planning.rdzv import meeting_point

    assert meeting_point("", None, None) == (None, None)
    assert meeting_point("", "10.0.0.1", 29500) == ("10.0.0.1", 29500)
    assert meeting_point("10.0.0.1:29400", None, None) == ("10.0.0.1", 29400)
    assert meeting_point("[::1]:29400", None, 29400) == ("::1", 29400)
    with pytest.raises(ValueError, match=r"rdzv_backend='etcd' is not one of 'static', 'c10d'"):
        notebook_launcher(print, rdzv_backend="etcd")  # the option's row, before any worker
    with pytest.raises(ValueError, match="is not 'host:port'"):
        meeting_point("10.0.0.1", None, None)
    with pytest.raises(ValueError, match="rdzv_endpoint='h:x': port='x' must be an integer"):
        meeting_point("h:x", None, None)
    with pytest.raises(ValueError, match="disagree"):
        meeting_point("10.0.0.1:29400", "10.0.0.2", None)
    with pytest.raises(ValueError, match="disagree"):
        meeting_point("10.0.0.1:29400", None, 29500)

