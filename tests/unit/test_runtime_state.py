"""PartialState, process control, seeding, logging and mixed-precision choice in one plain process."""

from __future__ import annotations

import logging
import random
import sys
import types

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator, PartialState, get_logger, set_seed
from notebook_accel.observe import logging as logging_utils
from notebook_accel.runtime import state as state_module
from notebook_accel.runtime.precision import resolve_mixed_precision
from notebook_accel.runtime.state import DistributedType, split_for_process

ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "NOTEBOOK_ACCEL_DEVICE", "NOTEBOOK_ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def test_no_environment_is_one_plain_process_without_process_group():
    state = PartialState()
    assert (state.process_index, state.num_processes, state.local_process_index) == (0, 1, 0)
    assert state.distributed_type == DistributedType.NO == "NO"
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert state.device == torch.device("cpu")
    assert not dist.is_initialized()  # the kernel can still fork workers


def test_world_size_one_from_torchrun_names_creates_no_process_group(monkeypatch):
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    acc = Accelerator()
    assert acc.num_processes == 1 and acc.distributed_type == "NO"
    assert not dist.is_initialized()


def test_several_accelerators_in_one_process_do_not_fight():
    a, b = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4), Accelerator()
    assert (a.mixed_precision, b.mixed_precision) == ("bf16", "no")
    assert (a.gradient_accumulation_steps, b.gradient_accumulation_steps) == (4, 1)
    assert a.gradient_state is not b.gradient_state


def test_bad_environment_values_are_named(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_ACCEL_DEVICE", "tpu")
    with pytest.raises(ValueError, match="NOTEBOOK_ACCEL_DEVICE='tpu'.*cpu"):
        PartialState()
    monkeypatch.setenv("NOTEBOOK_ACCEL_DEVICE", "cpu")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        PartialState()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="rank 2 is outside"):
        PartialState()


def test_cpu_flag_and_cuda_device_choice(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_ACCEL_DEVICE", "cuda")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert PartialState(cpu=True).device == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="NOTEBOOK_ACCEL_DEVICE=cuda.*cpu=True"):
            PartialState()


def test_xla_without_torch_xla_says_what_to_install(monkeypatch):
    monkeypatch.setenv("NOTEBOOK_ACCEL_DEVICE", "xla")
    monkeypatch.setitem(sys.modules, "torch_xla", None)
    with pytest.raises(ImportError, match="torch_xla"):
        PartialState()


@pytest.fixture
def fake_xla(monkeypatch):
    """A stand-in torch_xla (world size and ordinals set by the test) that records its calls."""
    calls: list[str] = []
    xm = types.SimpleNamespace(
        rendezvous=lambda tag: calls.append("rendezvous"),
        reduce_gradients=lambda opt: calls.append("reduce"),
        mark_step=lambda: calls.append("mark_step"),
        get_rng_state=lambda: 5, set_rng_state=lambda seed: calls.append(f"rng={seed}"),
    )
    xr = types.SimpleNamespace(global_ordinal=lambda: 0, world_size=lambda: 1, local_ordinal=lambda: 0)

    class MpDeviceLoader:
        def __init__(self, loader, device):
            calls.append("device_loader")
            self.loader = loader

        def __iter__(self):
            return iter(self.loader)

    pl = types.SimpleNamespace(MpDeviceLoader=MpDeviceLoader)
    core = types.SimpleNamespace(xla_model=xm)
    pkg = types.SimpleNamespace(core=core, runtime=xr, device=lambda: "xla:0", sync=lambda: calls.append("sync"))
    for name, mod in {"torch_xla": pkg, "torch_xla.core": core, "torch_xla.core.xla_model": xm,
                      "torch_xla.runtime": xr, "torch_xla.distributed.parallel_loader": pl}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv("NOTEBOOK_ACCEL_DEVICE", "xla")
    return types.SimpleNamespace(calls=calls, xr=xr)


def test_xla_dispatch_reads_ranks_and_device_from_torch_xla(fake_xla):
    state = PartialState()
    assert state.distributed_type == DistributedType.XLA and state.num_processes == 1
    assert state.backend is None and not dist.is_initialized()
    assert state.device == torch.device("xla", 0)
    with pytest.raises(ValueError, match="fp16.*XLA"):
        Accelerator(mixed_precision="fp16")


def test_xla_multi_replica_reduces_gradients_in_the_optimizer_not_ddp(fake_xla, monkeypatch):
    from notebook_accel.runtime import xla

    fake_xla.xr.global_ordinal, fake_xla.xr.local_ordinal, fake_xla.xr.world_size = (lambda: 1,) * 2 + (lambda: 2,)
    created = []
    monkeypatch.setattr(state_module, "ensure_process_group", lambda *a: created.append(a))

    def move_model(model, device):  # like XLA: new Parameter objects (kept on the CPU here)
        moved = {}
        for module in model.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                new = torch.nn.Parameter(param.detach().clone())
                setattr(module, name, new)
                moved[id(param)] = new
        return moved

    monkeypatch.setattr(xla, "move_model", move_model)
    acc = Accelerator(gradient_accumulation_steps=2)
    assert created == [("xla", 1, 2, None, torch.device("xla", 0))] and acc.process_index == 1
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=2)
    opt, model, loader = acc.prepare(opt, model, loader)  # optimizer first: rebound afterwards
    assert isinstance(model, torch.nn.Linear)  # no DDP on XLA
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in model.parameters()]
    before = model.weight.detach().clone()
    for (x,) in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum())
            opt.step()
            opt.zero_grad()
        if acc.sync_gradients:
            break
    assert not torch.equal(model.weight, before)  # the optimizer updated the moved parameters
    acc.wait_for_everyone()
    assert fake_xla.calls == ["device_loader", "reduce", "sync", "rendezvous"]


@pytest.mark.parametrize(
    ("inputs", "count", "pad", "expected"),
    [
        (list(range(5)), 2, False, [[0, 1, 2], [3, 4]]),
        (list(range(5)), 2, True, [[0, 1, 2], [3, 4, 4]]),
        (list(range(2)), 3, False, [[0], [1], []]),
        (("a", "b", "c", "d"), 2, False, [("a", "b"), ("c", "d")]),
    ],
)
def test_split_for_process(inputs, count, pad, expected):
    assert [split_for_process(inputs, i, count, pad) for i in range(count)] == expected


def test_split_tensors_and_dicts():
    parts = [split_for_process({"x": torch.arange(5)}, i, 2, True)["x"].tolist() for i in range(2)]
    assert parts == [[0, 1, 2], [3, 4, 4]]
    with pytest.raises(TypeError, match="set"):
        split_for_process({1, 2}, 0, 2)


def test_process_control_in_one_process(capsys):
    acc = Accelerator()
    with acc.main_process_first(), acc.local_main_process_first():
        pass
    acc.wait_for_everyone()
    assert acc.on_main_process(lambda x: x + 1)(1) == 2
    with acc.split_between_processes([1, 2, 3]) as mine:
        assert mine == [1, 2, 3]
    acc.print("hello")
    assert capsys.readouterr().out == "hello\n"
    acc.set_trigger()
    assert acc.check_trigger() is True and acc.check_trigger() is False


def test_mixed_precision_precedence(monkeypatch):
    assert resolve_mixed_precision(None) == "no"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert resolve_mixed_precision(None) == "fp16"
    monkeypatch.setenv("NOTEBOOK_ACCEL_MIXED_PRECISION", "bf16")
    assert resolve_mixed_precision(None) == "bf16"
    assert resolve_mixed_precision("no") == "no"
    assert Accelerator().mixed_precision == "bf16"
    with pytest.raises(ValueError, match="'fp8'.*'no', 'fp16', 'bf16'"):
        resolve_mixed_precision("fp8")


def test_set_seed_reproduces_every_generator():
    np = pytest.importorskip("numpy")

    def draw():
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    set_seed(3)
    first = draw()
    set_seed(3)
    assert draw() == first
    set_seed(4)
    assert draw() != first


def test_logger_is_main_process_only_by_default(monkeypatch, caplog):
    logger = get_logger("notebook_accel.test_runtime", log_level="INFO")
    with caplog.at_level(logging.INFO, logger="notebook_accel.test_runtime"):
        logger.info("on main")
        monkeypatch.setattr(logging_utils, "PartialState",
                            lambda: types.SimpleNamespace(is_main_process=False, num_processes=1, process_index=1))
        monkeypatch.setattr(logging_utils.os, "getpid", lambda: -1)  # as in a forked worker
        logger.info("hidden")
        logger.info("shown anyway", main_process_only=False)
    assert [r.getMessage() for r in caplog.records] == ["on main", "shown anyway"]


def test_cuda_dispatch_picks_local_rank_device_and_nccl(monkeypatch):
    chosen, created = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: chosen.append(device))
    monkeypatch.setattr(state_module, "ensure_process_group", lambda *a: created.append(a))
    for name, value in {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    state = PartialState()  # NOTEBOOK_ACCEL_DEVICE unset: CUDA because it is available
    assert state.device == torch.device("cuda", 1) and chosen == [torch.device("cuda", 1)]
    assert state.distributed_type == DistributedType.MULTI_GPU and state.num_local_processes == 2
    assert created == [("nccl", 3, 4, None, torch.device("cuda", 1))]
    assert not state.is_main_process and not state.is_local_main_process and state.is_last_process
    monkeypatch.setenv("NOTEBOOK_ACCEL_DEVICE", "cpu")
    assert PartialState().distributed_type == DistributedType.MULTI_CPU


def test_xla_checkpoint_saves_and_restores_the_xla_rng(fake_xla, tmp_path):
    acc = Accelerator()
    acc.prepare(torch.nn.Linear(2, 1), device_placement=[False])
    acc.save_state(tmp_path / "ck")
    assert torch.load(tmp_path / "ck" / "random_states_0.pkl", weights_only=True)["xm_seed"] == 5
    acc.load_state(tmp_path / "ck")
    assert "rng=5" in fake_xla.calls
