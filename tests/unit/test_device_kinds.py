"""A device described once (``machine/launch_kinds.py``): ``auto`` asks the kinds in order, a kind
notebook_accel cannot run on (an Intel XPU, Apple's MPS) is refused by name, never replaced by the
CPU in silence, and a new kind is one class in ``KINDS`` (docs/architecture.md, "Adding a device")."""

from __future__ import annotations

import pytest
import torch

from notebook_accel.launch.backends import Backend, backend_for
from notebook_accel.launch.planning.plan import make_plan
from notebook_accel.machine import devices, hardware
from notebook_accel.machine.launch_kinds import KINDS, DeviceKind
from notebook_accel.runtime import device
from notebook_accel.runtime.device import TorchDevice


@pytest.fixture
def probes(monkeypatch):
    """The hardware's probes, faked: say what this machine has (detect() looks again)."""
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.setattr(hardware, "gpu_names", lambda: [])
    monkeypatch.setattr(hardware, "tpu_present", lambda: False)
    hardware._detect.cache_clear()
    yield monkeypatch
    hardware._detect.cache_clear()


@pytest.mark.parametrize(("probe", "found", "named"), [
    ("xpu_count", 2, r"an Intel XPU \(torch\.xpu\) is visible, and notebook_accel does not run on XPUs yet"),
    ("mps_present", True, r"Apple's MPS \(torch\.backends\.mps\) is available, and notebook_accel does "
                          r"not run on MPS yet"),
])
def test_an_xpu_or_mps_machine_is_refused_by_name_never_run_on_the_cpu(probes, probe, found, named):
    probes.setattr(hardware, probe, lambda: found)
    with pytest.raises(ValueError, match=rf"^device=auto: {named}; pass device='cpu' \(or set "
                                         r"ACCELERATE_USE_CPU=yes\) to run on the CPU cores$"):
        make_plan(num_processes=2)
    assert make_plan(num_processes=2, device="cpu").device_type == "cpu"  # named: as asked
    probes.setenv("ACCELERATE_USE_CPU", "yes")
    assert make_plan(num_processes=2).device_type == "cpu"


def test_without_them_auto_is_the_cpu_as_before(probes):
    probes.setattr(hardware, "xpu_count", lambda: 0)
    probes.setattr(hardware, "mps_present", lambda: False)
    plan = make_plan(num_processes=2, mixed_precision="auto")
    assert (plan.device_type, plan.mixed_precision) == ("cpu", "bf16" if hardware.detect().cpu_bf16 else "no")


def test_each_kind_answers_for_itself():
    hw = hardware.Hardware(cpu_count=64, gpu_names=("NVIDIA H100",) * 4, gpu_capabilities=((9, 0),) * 4)
    assert [kind.name for kind in KINDS.values() if kind.available(hw)] == ["cuda", "cpu"]
    assert (devices.auto_device(hw), devices.every_device("cuda", hw), devices.every_device("cpu", hw)) \
        == ("cuda", 4, 8)
    assert KINDS["cuda"].native_precisions(hw) == ("bf16", "fp16") and devices.best_precision("cuda", hw) == "bf16"
    assert [KINDS[name].collective_backend for name in ("cuda", "xla", "cpu")] == ["nccl", "xla", "gloo"]
    assert TorchDevice().backend("cuda") == "nccl" and TorchDevice().backend("cpu") == "gloo"
    tpu = hardware.Hardware(cpu_count=8, tpu=True, tpu_cores=8)
    assert (devices.auto_device(tpu), devices.every_device("xla", tpu), devices.best_precision("xla", tpu)) \
        == ("xla", 8, "bf16")


class FakeBackend(Backend):
    """The launcher backend the fake kind names."""

    name = "fake"

    def start(self, plan, payload):
        raise NotImplementedError


class FakeDevice(TorchDevice):
    """The fake kind's worker side."""


class MetaKind(DeviceKind):
    """Adding a device, as docs/architecture.md says: one class, registered in ``KINDS``."""

    name, distributed_type = "meta", "MULTI_META"
    backend = f"{__name__}:FakeBackend"
    worker = f"{__name__}:FakeDevice"
    collective_backend = "fake-ccl"

    def available(self, hw):
        return True

    def count(self, hw):
        return 3

    def native_precisions(self, hw):
        return ("fp16",)


@pytest.fixture
def meta_first(probes):
    """``MetaKind`` registered first in ``KINDS`` (auto asks it before the others)."""
    saved = dict(KINDS)
    KINDS.clear()
    KINDS.update({"meta": MetaKind(), **saved})
    probes.setattr(device, "_made", {})
    yield
    KINDS.clear()
    KINDS.update(saved)


def test_a_new_kind_is_found_by_auto_and_answers_the_plan_the_backend_and_the_worker(meta_first):
    plan = make_plan(mixed_precision="auto")
    assert (plan.device_type, plan.num_processes, plan.mixed_precision) == ("meta", 3, "fp16")
    assert isinstance(backend_for(plan), FakeBackend)
    kind = device.device_kind(torch.device("meta"))
    assert type(kind) is FakeDevice and kind.backend("meta") == "fake-ccl"
    assert device.backend_kind("fake-ccl") is kind
