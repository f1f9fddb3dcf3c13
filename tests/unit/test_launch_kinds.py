"""The device kinds (``machine.launch_kinds``): the plan, the pool, ``backend_for`` and the config
file ask the kind of the plan's device type; adding a device is a kind (docs/architecture.md,
"Adding a device"; ``test_device_kinds.py`` adds one that auto finds)."""

from __future__ import annotations

import dataclasses

import pytest

from notebook_accel.config.schema import LaunchConfig
from notebook_accel.launch.backends import Backend, backend_for
from notebook_accel.launch.planning.plan import make_plan
from notebook_accel.launch.pools.pool import WorkerPool
from notebook_accel.machine import launch_kinds
from notebook_accel.machine.launch_kinds import KINDS, DeviceKind, device_launch, runnable_kinds


class FakeBackend(Backend):
    """The backend a fake device's row names."""

    name = "fake"

    def start(self, plan, payload):
        raise NotImplementedError


def _plan(device_type):
    plan = make_plan(num_processes=1, device="cpu", use_port=None)
    return dataclasses.replace(plan, device_type=device_type)


def test_every_device_type_has_a_row():
    from notebook_accel.contract import DEVICE_TYPES

    assert list(runnable_kinds()) == list(DEVICE_TYPES)
    assert device_launch("cpu").recorded_type(1) == "NO" and device_launch("cpu").recorded_type(2) == "MULTI_CPU"
    assert device_launch("xla").recorded_type(1) == "XLA"  # torch_xla's job, one process too


def test_a_new_row_chooses_its_backend_and_its_config_file_type(monkeypatch):
    class MetaKind(DeviceKind):
        name, distributed_type, own_type = "meta", "MULTI_META", True
        backend = f"{__name__}:FakeBackend"

    monkeypatch.setitem(KINDS, "meta", MetaKind())
    assert isinstance(backend_for(_plan("meta")), FakeBackend)
    assert launch_kinds.device_launch("meta").recorded_type(1) == "MULTI_META"
    assert type(backend_for(_plan("cpu"))).__name__ == "ProcessBackend"


def test_the_xla_row_refuses_a_pool_and_a_cluster_with_the_same_words(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    with pytest.raises(ValueError, match=r"^device='xla': a pool cannot keep TPU cores warm yet; use "
                                         r"notebook_launcher \(or %%accelerate --fresh\) on a TPU$"):
        WorkerPool._plan({"device": "xla", "num_processes": 1})
    with pytest.raises(ValueError, match=r"^device='xla' with cluster='head:6379': a cluster job runs on "
                                         r"'cpu' or 'cuda'$"):
        make_plan(device="xla", cluster="head:6379")


def test_the_config_file_records_xla_whatever_the_strategy():
    config = LaunchConfig(distributed_type="FSDP", num_processes=4)
    assert config.with_device("xla").distributed_type == "XLA"
    assert config.with_device("cuda").distributed_type == "FSDP"
    assert LaunchConfig(num_processes=2).with_device("cpu").distributed_type == "MULTI_GPU"  # use_cpu: cpu


def test_what_a_backend_can_do_it_says_itself_the_launcher_asks_it(monkeypatch, capsys):
    from notebook_accel.launch.backends import backend_class
    from notebook_accel.launch.launcher import print_notes
    from notebook_accel.launch.planning.start_method import StartChoice

    class RemoteBackend(FakeBackend):
        local = False  # its workers are not this kernel's processes: no start method of ours

    class RemoteKind(DeviceKind):
        name, distributed_type, backend = "remote", "MULTI_CPU", f"{__name__}:RemoteBackend"

    monkeypatch.setitem(globals(), "RemoteBackend", RemoteBackend)
    monkeypatch.setitem(KINDS, "remote", RemoteKind())
    plan = dataclasses.replace(_plan("cpu"), start=StartChoice("spawn", "because"))
    assert backend_class(plan).local and not backend_class(dataclasses.replace(plan, device_type="remote")).local
    assert not backend_class(dataclasses.replace(plan, cluster="head:6379")).local
    print_notes(plan, [])
    print_notes(dataclasses.replace(plan, device_type="remote"), [])
    assert capsys.readouterr().out == "[notebook_accel] start method: spawn (because)\n"
