"""Today's TPUs (issue 31, part 5), on this CPU machine: what the probes read is faked (PCI
entries, installed versions, ``sys.modules``, a ``/proc`` tree), or made for real (a process
holding a lock file)."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from magics.panel.rules import default_processes, effective_device, max_processes
from notebook_accel.launch import launcher
from notebook_accel.launch.backends import xla as xla_backend
from notebook_accel.launch.planning.plan import make_plan
from notebook_accel.machine import devices, hardware, tpu, tpu_holders
from notebook_accel.machine.hardware import Hardware

V5E_1 = Hardware(cpu_count=44, tpu=True, tpu_cores=1)  # Colab's TPU runtime
V5E_8 = Hardware(cpu_count=96, tpu=True, tpu_cores=8)  # Kaggle's


@pytest.fixture
def on(monkeypatch):
    """``on(hw)``: the launch and the panel see ``hw``; no PJRT_DEVICE of the test's own."""
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.setattr(hardware, "detect", lambda: hw_box[0])
    hw_box = [None]

    def use(hw: Hardware) -> None:
        hw_box[0] = hw
    return use


def _plan(**options):
    base = dict(num_processes=None, mixed_precision=None, use_port=None, master_addr="127.0.0.1",
                node_rank=0, num_nodes=1, start_method="spawn", timeout=None, output="none",
                return_all=False, max_restarts=0, device=None)
    return make_plan(**{**base, **options})


def _pci(root, *device_ids):
    for i, device in enumerate(device_ids):
        entry = root / f"0000:00:0{i}.0"
        entry.mkdir(parents=True)
        (entry / "vendor").write_text("0x1ae0\n")
        (entry / "device").write_text(device + "\n")


@pytest.mark.parametrize(("chips", "cores"), [(1, 1), (8, 8)])
def test_v5e_chips_are_counted_from_pci(tmp_path, chips, cores):
    _pci(tmp_path, *["0x0063"] * chips)  # v5e's PCI id
    assert tpu.tpu_core_count({}, pci_root=tmp_path, dev_root=tmp_path) == cores


@pytest.mark.parametrize(("hw", "cores"), [(V5E_1, 1), (V5E_8, 8)])
def test_every_device_is_every_chip_and_the_panel_agrees_with_the_launcher(on, hw, cores):
    on(hw)
    plan = _plan()
    assert plan.device_type == "xla" == effective_device("auto", hw) == devices.auto_device(hw)
    assert plan.xla.world_size == cores and plan.xla.nprocs is None
    assert default_processes("auto", hw) == max_processes("auto", hw) == cores


def test_more_processes_than_chips_refused_before_any_worker(on, monkeypatch):
    on(V5E_1)
    monkeypatch.setattr(launcher, "backend_for", lambda plan: pytest.fail("a backend was asked"))
    with pytest.raises(ValueError) as info:
        launcher.notebook_launcher(print, num_processes=8)
    message = str(info.value)
    assert message.startswith("num_processes=8 with device='xla', but this TPU has 1 core")
    assert "Valid here: num_processes=None (every core) or 1" in message
    on(V5E_8)
    with pytest.raises(ValueError, match=r"num_processes=9 .* has 8 cores.*None \(every core\), 1 or 8"):
        _plan(num_processes=9)
    assert _plan(num_processes=8).xla.world_size == 8 and _plan(num_processes=1).xla.nprocs == 1


def test_auto_precision_on_a_tpu_is_bf16(on):
    on(V5E_1)
    assert _plan(mixed_precision="auto").mixed_precision == "bf16"


@pytest.mark.parametrize(("installed", "expected", "absent"), [
    # Kaggle's pins with torch_xla removed: torch_xla alone, libtpu left as it is
    ({"torch": "2.8.0+cpu", "libtpu": "0.0.17"}, 'pip install "torch_xla==2.8.0"', "[tpu]"),
    ({"torch": "2.9.0+cpu"}, 'pip install "torch_xla[tpu]==2.9.0"', "torch=="),
    ({}, "pip install torch --index-url https://download.pytorch.org/whl/cpu", "torch~="),
])
def test_install_hint_never_replaces_torch_or_libtpu(monkeypatch, installed, expected, absent):
    monkeypatch.setattr(tpu, "_installed", installed.get)
    hint = tpu.install_hint()
    assert hint.startswith(expected) and absent not in hint, hint


def test_a_platform_with_torch_xla_is_told_to_install_nothing(monkeypatch):
    monkeypatch.setattr(xla_backend, "_torch_xla_installed", lambda: False)
    monkeypatch.setattr(tpu, "_installed", {"torch": "2.8.0"}.get)
    plan = dataclasses.replace(_plan(device="cpu"), device_type="xla",
                               xla=tpu.XlaJob("TPU", None, 8))
    with pytest.raises(ImportError, match=r'needs torch_xla, which is not installed here: '
                                          r'pip install "torch_xla\[tpu\]==2\.8\.0"'):
        xla_backend.XlaBackend().check(plan)


def _jax(*backends):
    return {"jax": types.ModuleType("jax"),
            "jax._src.xla_bridge": types.SimpleNamespace(_backends=dict.fromkeys(backends))}


def test_jax_holding_the_tpu_is_seen_without_importing_jax():
    assert tpu_holders.jax_holds_tpu(_jax("tpu", "cpu"))
    assert not tpu_holders.jax_holds_tpu(_jax("cpu"))  # JAX_PLATFORMS=cpu
    assert not tpu_holders.jax_holds_tpu(_jax())  # imported, no backend started yet
    assert not tpu_holders.jax_holds_tpu({})
    assert "jax" not in sys.modules or "jax._src.xla_bridge" in sys.modules


def test_holders_found_in_a_proc_tree(tmp_path):
    lock = "/tmp/libtpu_lockfile"
    for pid, target, command in [(101, lock, b"python\0train.py\0"),
                                 (102, "/dev/vfio/0", b"python\0-m\0ipykernel_launcher\0"),
                                 (103, "/dev/vfio/vfio", b"other\0"), (104, "/dev/null", b"x\0")]:
        (tmp_path / str(pid) / "fd").mkdir(parents=True)
        (tmp_path / str(pid) / "fd" / "3").symlink_to(target)
        (tmp_path / str(pid) / "cmdline").write_bytes(command)
    (tmp_path / "self").mkdir()
    assert tpu_holders.tpu_holders(tmp_path, exclude=frozenset({102})) == {101: "python train.py"}
    assert set(tpu_holders.tpu_holders(tmp_path, exclude=frozenset())) == {101, 102}


def _tpu_plan():
    return dataclasses.replace(_plan(device="cpu"), device_type="xla",
                               xla=tpu.XlaJob("TPU", None, 1))


def test_launch_refused_up_front_when_jax_or_another_process_holds_the_tpu(monkeypatch):
    monkeypatch.setattr(xla_backend, "_torch_xla_installed", lambda: True)
    monkeypatch.setattr(tpu_holders, "tpu_holders", lambda: {})
    xla_backend.XlaBackend().check(_tpu_plan())  # nothing holds it
    for name, module in _jax("tpu").items():
        monkeypatch.setitem(sys.modules, name, module)
    with pytest.raises(RuntimeError, match="jax in this kernel has initialised its TPU backend"):
        xla_backend.XlaBackend().check(_tpu_plan())
    cpu_plan = dataclasses.replace(_tpu_plan(), xla=tpu.XlaJob("CPU", None, 1))
    xla_backend.XlaBackend().check(cpu_plan)  # PJRT_DEVICE=CPU: jax's TPU is no obstacle
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", types.SimpleNamespace(_backends={}))
    monkeypatch.setattr(tpu_holders, "tpu_holders", lambda: {4242: "python other_notebook.py"})
    with pytest.raises(RuntimeError, match=r"held by another process: pid 4242 \(python other_"):
        xla_backend.XlaBackend().check(_tpu_plan())
