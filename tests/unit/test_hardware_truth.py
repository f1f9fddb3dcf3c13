"""What the hardware cannot do is said before any worker starts (issue 31, part 3), on this CPU
machine, in this process: what the probes find is faked (the detected hardware, torch's arch list);
the probes themselves, with child processes, are in tests/runtime/test_hardware_truth.py."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from magics.panel.rules import precision_choices
from notebook_accel.launch.launcher import notebook_launcher, plan_launch
from notebook_accel.launch.planning import plan as planmod
from notebook_accel.launch.planning.request import LaunchRequest
from notebook_accel.machine import devices, gpu_support, hardware
from notebook_accel.machine.hardware import Hardware

REPO = Path(__file__).resolve().parents[2]
CU128 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")  # torch 2.8+cu128
CU126 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
T4X2 = Hardware(cpu_count=8, gpu_names=("Tesla T4",) * 2, gpu_capabilities=((7, 5),) * 2)
P100 = Hardware(cpu_count=4, gpu_names=("Tesla P100-PCIE-16GB",), gpu_capabilities=((6, 0),))
H100 = Hardware(cpu_count=16, gpu_names=("NVIDIA H100 80GB HBM3",), gpu_capabilities=((9, 0),))


@pytest.fixture
def machine(monkeypatch):
    """Fake what the launch detects: ``machine(hw, arch_list)``; torch is a cu128 build."""
    def use(hw: Hardware, arch_list: tuple[str, ...] = CU128) -> None:
        monkeypatch.setattr(hardware, "detect", lambda: hw)
        monkeypatch.setattr(gpu_support, "torch_arch_list", lambda: arch_list)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(planmod, "_shm_said", set())
    return use


def plan(**options):
    settings = dict(num_processes=None, mixed_precision=None, use_port=None, master_addr="127.0.0.1",
                    node_rank=0, num_nodes=1, start_method="spawn", timeout=None, output="none",
                    return_all=False, max_restarts=0, device="cuda")
    return planmod.make_plan(**{**settings, **options})


def launch_plan(notes=None, config_file=None, **explicit):
    request = LaunchRequest.from_keywords(
        "notebook_launcher", {**explicit, "config_file": config_file, "output": "none"})
    return plan_launch(request, [] if notes is None else notes)


def test_bf16_is_judged_by_the_capability_before_the_name():
    assert gpu_support.gpu_supports_bf16("Tesla T4") is False  # emulated bf16 does not count
    assert gpu_support.gpu_supports_bf16("NVIDIA GPU") is None
    assert gpu_support.gpu_supports_bf16("NVIDIA GPU", (8, 6)) is True
    assert gpu_support.gpu_supports_bf16("NVIDIA GPU", (7, 5)) is False
    assert gpu_support.gpu_supports_bf16("Tesla P100-PCIE-16GB", (6, 0)) is False


@pytest.mark.parametrize("capability, arch_list, runs", [
    ((7, 5), CU128, True),
    ((6, 0), CU128, False),   # Kaggle's P100 on torch 2.8+cu128
    ((7, 0), CU128, False),   # V100: Volta left the cu128 builds too
    ((6, 0), CU126, True),
    ((8, 9), CU126, True),    # an L4 runs sm_86 cubins (same major, newer minor)
    ((8, 0), ("sm_86", "sm_90"), False),  # a cubin never runs on an older minor
    ((9, 0), ("sm_75", "compute_80"), True),  # PTX: compiled by the driver for newer GPUs
    ((7, 5), ("compute_80",), False),
    ((9, 0), ("sm_90a",), True), ((10, 0), ("sm_90a",), False),  # arch-specific: exactly 9.0
    ((12, 1), ("sm_120f",), True),
])
def test_which_gpus_a_torch_build_runs(capability, arch_list, runs):
    assert gpu_support.torch_runs(capability, arch_list) is runs


def test_an_unknown_arch_list_or_capability_refuses_nothing():
    assert gpu_support.gpus_torch_cannot_run(P100, ()) == []
    unknown = Hardware(cpu_count=4, gpu_names=("Tesla P100-PCIE-16GB",))
    assert gpu_support.gpus_torch_cannot_run(unknown, CU128) == []


# -- the launch refuses, before any worker starts ---------------------------------------------

def test_bf16_on_a_t4_is_refused_naming_the_gpu_and_fp16(machine):
    machine(T4X2)
    with pytest.raises(ValueError) as err:
        plan(mixed_precision="bf16")
    message = str(err.value)
    assert message.startswith("mixed_precision='bf16' on Tesla T4 (compute capability 7.5)")
    assert "8.0" in message and "'fp16'" in message and "'no'" in message
    assert plan(mixed_precision="fp16").mixed_precision == "fp16"
    assert plan(mixed_precision="bf16", device="cpu").mixed_precision == "bf16"  # CPU autocast
    machine(H100)
    assert plan(mixed_precision="bf16").mixed_precision == "bf16"


def test_bf16_is_refused_by_the_name_when_no_capability_is_known(machine):
    machine(Hardware(cpu_count=2, gpu_names=("Tesla V100-SXM2-16GB",)), CU126)
    with pytest.raises(ValueError, match=r"mixed_precision='bf16' on Tesla V100-SXM2-16GB: bf16 "):
        plan(mixed_precision="bf16")
    machine(Hardware(cpu_count=2, gpu_names=("NVIDIA GPU",)))
    assert plan(mixed_precision="bf16").mixed_precision == "bf16"  # cannot tell: not refused


def test_bf16_refusal_says_where_the_value_came_from(machine, monkeypatch, tmp_path):
    machine(T4X2)
    with pytest.raises(ValueError, match=r"^mixed_precision='bf16' on Tesla T4"):
        launch_plan(mixed_precision="bf16")  # an argument (a flag: named, below)
    monkeypatch.setenv("NOTEBOOK_ACCEL_MIXED_PRECISION", "bf16")
    with pytest.raises(ValueError, match=r"^environment variable NOTEBOOK_ACCEL_MIXED_PRECISION: "
                                         r"mixed_precision='bf16' on Tesla T4"):
        launch_plan()
    monkeypatch.delenv("NOTEBOOK_ACCEL_MIXED_PRECISION")
    config = tmp_path / "c.yaml"
    config.write_text("num_processes: 2\nmixed_precision: bf16\n")
    with pytest.raises(ValueError, match=rf"^{config}, line 2: mixed_precision='bf16' on Tesla T4"):
        launch_plan(config_file=config)
    assert launch_plan(config_file=config, mixed_precision="fp16").mixed_precision == "fp16"


def test_a_gpu_outside_torchs_build_is_refused_naming_it_and_the_build(machine):
    machine(P100)
    with pytest.raises(ValueError) as err:
        plan()
    message = str(err.value)
    assert message.startswith("Tesla P100-PCIE-16GB (compute capability 6.0, sm_60): the installed "
                              f"torch {torch.__version__} (CUDA 12.8) has no kernels for it")
    assert " ".join(CU128) in message and "device='cpu'" in message and "sm_60" in message
    assert "CUDA_VISIBLE_DEVICES" not in message  # no other GPU to keep
    mixed = Hardware(cpu_count=4, gpu_names=("Tesla P100-PCIE-16GB", "Tesla T4"),
                     gpu_capabilities=((6, 0), (7, 5)))
    machine(mixed)
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES to leave it out"):
        plan(num_processes=1)
    machine(P100, CU126)
    assert plan().num_processes == 1


def test_the_launcher_and_a_pool_refuse_before_any_worker_starts(machine, monkeypatch):
    from notebook_accel.launch import launcher
    from notebook_accel.launch.pools import pool
    from notebook_accel.launch.pools.pool import WorkerPool

    machine(T4X2)
    started = []  # what would start workers, had the plan passed
    monkeypatch.setattr(launcher, "backend_for", lambda plan: started.append(plan))
    monkeypatch.setattr(pool, "pool_workers", lambda plan: started.append(plan))
    with pytest.raises(ValueError, match="mixed_precision='bf16' on Tesla T4"):
        notebook_launcher(print, mixed_precision="bf16")
    with pytest.raises(ValueError, match="mixed_precision='bf16' on Tesla T4"):
        WorkerPool(mixed_precision="bf16")
    machine(P100)
    with pytest.raises(ValueError, match="sm_60"):
        notebook_launcher(print, num_processes=1)
    assert started == []


def test_the_cli_refuses_bf16_on_a_t4_naming_it(machine, tmp_path, capsys):
    from notebook_accel.cli import main

    machine(T4X2)
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a worker started')\n")
    assert main(["launch", "--mixed-precision", "bf16", str(script)]) == 1
    assert ("notebook-accel launch: error: flag --mixed-precision: mixed_precision='bf16' on "
            "Tesla T4" in capsys.readouterr().err)  # the flag's request reaches the plan


@pytest.mark.parametrize("hw", [T4X2, P100, H100,
                                Hardware(cpu_count=2, gpu_names=("Tesla T4",)),
                                Hardware(cpu_count=2, gpu_names=("NVIDIA GPU",)),
                                Hardware(cpu_count=2, gpu_names=("NVIDIA GPU",),
                                         gpu_capabilities=((8, 0),))])
def test_the_panel_offers_bf16_exactly_where_a_launch_takes_it(machine, hw):
    machine(hw, CU126)
    offered = {c.value: c.enabled for c in precision_choices("cuda", hw)}["bf16"]
    try:
        plan(mixed_precision="bf16")
        launched = True
    except ValueError:
        launched = False
    assert offered is launched


# -- /dev/shm ---------------------------------------------------------------------------------

CPU_BF16 = Hardware(cpu_count=4, cpu_bf16=True)
CPU_OLD = Hardware(cpu_count=4)
NAMELESS = Hardware(cpu_count=4, gpu_names=("NVIDIA GPU",))  # no capability, an unknown name


@pytest.mark.parametrize(("hw", "device", "best", "count"), [
    (T4X2, "cuda", "fp16", 2), (H100, "cuda", "bf16", 1), (P100, "cuda", "fp16", 1),
    (NAMELESS, "cuda", "fp16", 1), (CPU_BF16, "cpu", "bf16", 4), (CPU_OLD, "cpu", "no", 4),
    (Hardware(cpu_count=64), "cpu", "no", 8),  # every CPU core, at most 8
])
def test_auto_means_every_device_and_the_best_precision_it_has(machine, hw, device, best, count):
    machine(hw, CU126)  # a build that runs the P100 too
    notes = []
    chosen = launch_plan(notes, mixed_precision="auto", device=None)
    assert (chosen.device_type, chosen.mixed_precision, chosen.num_processes) == (device, best, count)
    assert notes[0].startswith(f"mixed precision auto: {best} (")
    assert devices.best_precision(device, hw) == best
    [auto] = [c for c in precision_choices("auto", hw) if c.value == "auto"]
    assert auto.enabled and f": {best} here" in auto.tooltip  # the panel says the same


def test_auto_precision_from_a_flag_file_or_variable_is_checked_as_any_value(machine, monkeypatch):
    machine(T4X2)
    monkeypatch.setenv("NOTEBOOK_ACCEL_MIXED_PRECISION", "auto")
    assert launch_plan().mixed_precision == "fp16"
    with pytest.raises(ValueError, match="'no', 'fp16', 'bf16', 'auto'"):
        launch_plan(mixed_precision="best")
    with pytest.raises(ValueError, match="mixed_precision='auto' with cluster="):
        plan(mixed_precision="auto", cluster="auto")


def test_cpu_bf16_from_cpuinfo_flags():
    assert hardware.cpu_has_bf16("processor : 0\nflags : fpu sse avx512f avx512_bf16\n")
    assert hardware.cpu_has_bf16("flags : fpu amx_bf16 amx_tile\n")
    assert hardware.cpu_has_bf16("Features : fp asimd bf16 i8mm\n")  # Arm (Graviton 3, Ampere)
    assert not hardware.cpu_has_bf16("flags : fpu sse avx2 avx512f\n")
    assert not hardware.cpu_has_bf16("")


def test_a_small_dev_shm_is_said_once_with_what_breaks_and_the_fix(machine):
    machine(T4X2)
    cuda = plan(num_processes=2)
    note = planmod.shm_note(cuda, size=64 << 20)
    assert note.startswith("/dev/shm is only 64 MB, less than 2 workers need (512 MB or more)")
    assert "NCCL's shared-memory transport" in note and "DataLoader workers" in note
    assert "--shm-size=1g" in note and "NCCL_SHM_DISABLE=1" in note
    assert planmod.shm_note(cuda, size=64 << 20) is None  # once per kernel
    cpu = dataclasses.replace(cuda, device_type="cpu")
    note = planmod.shm_note(cpu, size=64 << 20)
    assert "DataLoader workers" in note and "--shm-size=1g" in note and "NCCL" not in note
    assert planmod.shm_note(dataclasses.replace(cpu, num_processes=1), size=1) is None
    assert planmod.shm_note(dataclasses.replace(cuda, num_processes=4), size=1 << 30) is None


def test_dev_shm_size_is_read_with_statvfs(tmp_path):
    assert hardware.shm_bytes(str(tmp_path / "missing")) is None
    stats = os.statvfs(tmp_path)
    assert hardware.shm_bytes(str(tmp_path)) == stats.f_blocks * stats.f_frsize


_PLAN_TWO = """\
from notebook_accel.launch.launcher import plan_launch, print_notes
from notebook_accel.launch.planning.request import LaunchRequest
for device in ("cpu", "cpu"):  # the second launch says nothing more
    notes = []
    plan = plan_launch(LaunchRequest({"num_processes": 2, "device": device, "output": "none"}),
                       notes)
    print_notes(plan, notes)
"""
