"""Adding a device kind (docs/architecture.md, "Adding a device"): a ``TorchDevice`` subclass that
its kind in ``machine.launch_kinds.KINDS`` names as its ``worker``; the process's placement, its RNG states in checkpoints, copies to
the CPU and the loaders' batches then go through it, with nothing else changed."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator
from notebook_accel.machine.launch_kinds import KINDS, DeviceKind
from notebook_accel.runtime import device
from notebook_accel.runtime import state as state_module
from notebook_accel.runtime.device import Placement, TorchDevice


class FakeDevice(TorchDevice):
    """A device kind that records what it is asked."""

    moves_batches = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def locate(self, device_type: str, cpu: bool) -> Placement:
        self.calls.append("locate")
        return Placement(0, 1, 0, torch.device("meta"))

    def rng_state(self) -> dict:
        return {"fake_seed": 7}

    def set_rng_state(self, state: dict) -> None:
        self.calls.append(f"rng={state.get('fake_seed')}")

    def to_cpu(self, obj):
        self.calls.append("to_cpu")
        return obj

    def batches(self, batches, device):
        self.calls.append("batches")
        return batches


class MetaKind(DeviceKind):
    """The fake device's one description: the kernel's side, and its worker-side class."""

    name, distributed_type, worker = "meta", "MULTI_CPU", f"{__name__}:FakeDevice"


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(KINDS, "meta", MetaKind())
    monkeypatch.setattr(device, "_made", {})
    monkeypatch.setattr(state_module, "_device_type", lambda cpu: "meta")
    return device.device_kind("meta")


def test_a_registered_device_kind_places_the_process_and_owns_its_rng_cpu_copies_and_batches(fake, tmp_path):
    accelerator = Accelerator()
    assert accelerator.device == torch.device("meta")
    assert accelerator.state.device_kind is fake and accelerator.strategy.device_kind is fake
    accelerator.prepare(torch.nn.Linear(2, 1), device_placement=[False])
    accelerator.save_state(tmp_path / "ck")
    assert torch.load(tmp_path / "ck" / "random_states_0.pkl", weights_only=True)["fake_seed"] == 7
    accelerator.load_state(tmp_path / "ck")
    accelerator.save({"w": torch.ones(1)}, tmp_path / "w.pt")
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2))
    assert [batch[0].device.type for batch in loader] == ["cpu", "cpu"]  # the kind moves them (here: not)
    assert fake.calls == ["locate", "to_cpu", "to_cpu", "rng=7", "to_cpu", "batches"]
    accelerator.free_memory()


def test_the_xla_kind_is_found_by_device_type_without_importing_torch_xla():
    import sys

    kind = device.device_kind("xla")
    assert type(kind).__name__ == "XlaDevice" and not kind.torch_native and kind.backend("xla") == "xla"
    assert type(device.device_kind(torch.device("cpu"))) is TorchDevice
    assert device.device_kind("cpu") is device.device_kind("cuda:0") is device.device_kind("mps")
    assert device.backend_kind("xla") is kind and device.backend_kind("gloo") is device.device_kind("cpu")
    assert pickle.loads(pickle.dumps(kind)) is kind  # a pickled state (the peer's test) stays equal
    assert pickle.loads(pickle.dumps(device.device_kind("cpu"))) is device.device_kind("cpu")
    assert "torch_xla" not in sys.modules or sys.modules["torch_xla"] is None


def test_the_workers_memory_figure_is_the_kind_s(fake, monkeypatch):
    import threading

    from notebook_accel.launch.worker import main as worker_main

    sent, done = [], threading.Event()
    monkeypatch.setattr(FakeDevice, "memory_reserved", lambda self, where: 42 if where.type == "meta" else None,
                        raising=False)
    # a figure until one is sent: the reporter's thread then ends, as on a kind that keeps none
    monkeypatch.setattr(FakeDevice, "keeps_memory_figure", lambda self, where: not sent, raising=False)

    def emit(kind, data, key=None):
        sent.append((kind, data, key))
        done.set()

    monkeypatch.setattr(worker_main.events, "emit", emit)
    worker_main.report_memory("meta", 0, every=0.01)
    assert done.wait(5)
    assert sent[0] == (worker_main.Kind.MEMORY, {"gpu": 42}, "gpu")


def test_kinds_without_a_memory_figure_say_none():
    import sys

    assert device.device_kind("cpu").memory_reserved(torch.device("cpu")) is None
    assert not device.device_kind("cpu").keeps_memory_figure(torch.device("cpu"))  # its reporter ends
    assert device.device_kind("mps").memory_reserved(torch.device("mps")) is None
    if not torch.cuda.is_available():
        assert device.device_kind("cuda").memory_reserved(torch.device("cuda", 0)) is None
    if "torch_xla" not in sys.modules:  # asking must not start (or import) the XLA runtime
        assert device.device_kind("xla").memory_reserved(torch.device("xla", 0)) is None
        assert "torch_xla" not in sys.modules


def test_an_rng_state_travels_where_the_kinds_collective_device_rule_says(monkeypatch):
    """One rule: broadcast_rng_state asks collective_device (no copy by backend name); with no
    device given, that is the current GPU where the group runs the GPUs' backend, else the CPU."""
    import torch.distributed as dist

    from notebook_accel.runtime.device import TorchDevice

    kind, seen, asked = TorchDevice(), [], []
    monkeypatch.setattr(dist, "broadcast", lambda tensor, src: seen.append(tensor.device))
    monkeypatch.setattr(dist, "get_backend", lambda *group: "gloo")
    state = torch.get_rng_state()
    assert torch.equal(kind.broadcast_rng_state(state), state) and seen == [torch.device("cpu")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert kind.collective_device() == torch.device("cpu")  # gloo
    monkeypatch.setattr(dist, "get_backend", lambda *group: "nccl")
    assert kind.collective_device() == torch.device("cuda", 1)
    rule = TorchDevice.collective_device
    monkeypatch.setattr(TorchDevice, "collective_device",
                        lambda self, device=None: asked.append(rule(self, device)) or torch.device("cpu"))
    kind.broadcast_rng_state(state)
    assert asked == [torch.device("cuda", 1)]
