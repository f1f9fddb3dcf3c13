"""The TPU path's decisions, tested without torch_xla (which the main venv does not have)."""

from __future__ import annotations

import dataclasses
import pickle
import sys
import types

import pytest
import torch

from notebook_accel.launch.backends import Backend, backend_for
from notebook_accel.launch.backends import xla as xla_backend
from notebook_accel.launch.backends.processes import ProcessBackend
from notebook_accel.launch.planning.plan import make_plan
from notebook_accel.launch.worker import xla_cores
from notebook_accel.machine import tpu as detect
from notebook_accel.runtime import xla as runtime


def _pci(root, *devices, vendor="0x1ae0"):
    for i, device in enumerate(devices):
        entry = root / f"0000:00:{i:02x}.0"
        entry.mkdir(parents=True)
        (entry / "vendor").write_text(vendor + "\n")
        (entry / "device").write_text(device + "\n")
    return root


# ---- detection -------------------------------------------------------------------------------

def test_tpu_cores_from_pci_v2_chips_hold_two_cores(tmp_path):
    pci = _pci(tmp_path / "pci", *["0x0027"] * 4)
    assert detect.tpu_chips(pci) == ["0x0027"] * 4
    assert detect.tpu_core_count({}, pci, tmp_path / "dev") == 8


def test_tpu_cores_from_pci_v5e_and_foreign_devices(tmp_path):
    pci = _pci(tmp_path / "pci", "0x0063")
    _pci(tmp_path / "other", "0x0063", vendor="0x10de")  # an NVIDIA device with a TPU-like id
    assert detect.tpu_core_count({}, pci, tmp_path / "dev") == 1
    assert detect.tpu_chips(tmp_path / "other") == []


def test_tpu_cores_without_pci_from_accelerator_type_then_dev_files(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    empty = tmp_path / "nopci"
    assert detect.tpu_core_count({"TPU_ACCELERATOR_TYPE": "v3-8"}, empty, dev) == 8
    assert detect.tpu_core_count({"TPU_ACCELERATOR_TYPE": "v4-32"}, empty, dev) is None
    for i in range(4):
        (dev / f"accel{i}").touch()
    assert detect.tpu_core_count({}, empty, dev) == 4
    assert detect.tpu_core_count({}, empty, tmp_path / "nothing") is None


def test_pjrt_device_from_env_or_tpu():
    assert detect.pjrt_device({"PJRT_DEVICE": "cpu"}) == "CPU"
    assert detect.pjrt_device({"PJRT_DEVICE": "TPU"}, tpu=False) == "TPU"
    assert detect.pjrt_device({}, tpu=True) == "TPU"
    assert detect.pjrt_device({}, tpu=False) is None
    with pytest.raises(ValueError, match="PJRT_DEVICE='GPUX' is not one of TPU, CPU, CUDA"):
        detect.pjrt_device({"PJRT_DEVICE": "GPUX"})


def test_tpu_detected_from_colab_kaggle_and_cloud_env(monkeypatch):
    from notebook_accel.machine import hardware

    for name in ("PJRT_DEVICE", "COLAB_TPU_ADDR", "TPU_NAME", "KAGGLE_TPU", "TPU_ACCELERATOR_TYPE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("PJRT_DEVICE", "TPU"), ("COLAB_TPU_ADDR", "10.0.0.2:8470"),
                        ("TPU_NAME", "my-tpu"), ("TPU_ACCELERATOR_TYPE", "v5litepod-1")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            assert hardware.tpu_present(), name


def test_runtime_initialised_reads_only_loaded_modules(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
    assert not detect.runtime_initialised()
    assert "torch_xla" not in sys.modules  # it did not import it
    fake = types.SimpleNamespace(_XLAC=types.SimpleNamespace(_xla_runtime_is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch_xla", fake)
    assert detect.runtime_initialised()


def test_to_cpu_leaves_cpu_data_alone():
    data = {"w": torch.ones(2), "step": 3, "groups": [{"lr": 0.1}]}
    assert runtime.to_cpu(data) is data


def test_missing_torch_xla_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # import fails
    monkeypatch.setitem(sys.modules, "torch_xla.core.xla_model", None)
    version = detect._installed("torch").split("+")[0]  # the installed torch's own torch_xla
    with pytest.raises(ImportError, match=rf'pip install "torch_xla\[tpu\]=={version}"'):
        runtime.sync()
    with pytest.raises(ImportError, match="torch_xla"):
        runtime.rendezvous("x")


# ---- num_processes: what torch_xla can run -------------------------------------------------

@pytest.mark.parametrize(("num_processes", "nprocs", "world"), [(None, None, 8), (8, None, 8), (1, 1, 1)])
def test_num_processes_torch_xla_supports(num_processes, nprocs, world):
    job = detect.resolve_job(num_processes, pjrt="TPU", cores=8)
    assert (job.nprocs, job.world_size) == (nprocs, world)


def test_other_num_processes_refused_naming_what_torch_xla_supports():
    with pytest.raises(ValueError) as info:
        detect.resolve_job(4, pjrt="TPU", cores=8)
    message = str(info.value)
    assert "num_processes=4" in message
    assert "all 8 cores" in message
    assert "Valid here: num_processes=None (every core), 1 or 8" in message


def test_unknown_core_count_allows_all_or_one():
    assert detect.resolve_job(None, pjrt="TPU", cores=None).nprocs is None
    with pytest.raises(ValueError, match="unknown before the runtime starts"):
        detect.resolve_job(4, pjrt="TPU", cores=None)


def test_no_tpu_and_no_pjrt_device_is_refused():
    with pytest.raises(ValueError, match="no TPU is detected here and PJRT_DEVICE is not set"):
        detect.resolve_job(None, pjrt=None, cores=None)


def test_several_nodes_refused():
    with pytest.raises(ValueError, match="num_nodes=2 with device='xla'"):
        detect.resolve_job(None, pjrt="TPU", cores=8, num_nodes=2)


def test_xla_job_reads_this_machine(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    assert detect.xla_job(None, tpu=False, tpu_cores=None) == detect.XlaJob("CPU", None, 1)
    assert detect.xla_job(1, tpu=False, tpu_cores=None).world_size == 1
    with pytest.raises(ValueError, match="num_processes=2 with device='xla'"):
        detect.xla_job(2, tpu=False, tpu_cores=None)


# ---- the launch itself, with the worker machinery faked ------------------------------------

def _plan(**changes):
    plan = make_plan(num_processes=1, mixed_precision=None, use_port=None, master_addr="127.0.0.1",
                     node_rank=0, num_nodes=1, start_method="auto", timeout=None, output="all",
                     return_all=True, max_restarts=0, device="cpu")
    return dataclasses.replace(plan, device_type="xla", **changes)


@pytest.fixture
def torch_xla_installed(monkeypatch):
    monkeypatch.setattr(xla_backend, "_torch_xla_installed", lambda: True)


class _Hosts(Backend):
    """A stand-in for the local-processes backend that starts the XLA host worker."""

    def __init__(self):
        self.started = []

    def start(self, plan, payload):
        self.started.append((plan, pickle.loads(payload)))
        return "the host worker's group"


def test_missing_torch_xla_refused_before_any_worker():
    hosts = _Hosts()
    with pytest.raises(ImportError, match=r"needs torch_xla.*pip install \"torch_xla"):
        xla_backend.XlaBackend(hosts).check(_plan(xla=detect.XlaJob("TPU", None, 8)))
    assert hosts.started == []


def test_xla_backend_starts_one_host_worker_running_torch_xla_launcher(torch_xla_installed):
    hosts = _Hosts()
    job = detect.XlaJob("TPU", None, 8)
    backend = xla_backend.XlaBackend(hosts)
    backend.check(_plan(xla=job))
    assert backend.start(_plan(xla=job), b"user payload") == "the host worker's group"
    (plan, (function, args, kwargs, _sources, _numbers)), = hosts.started
    assert plan.num_processes == 1 and plan.return_all is False and plan.device_type == "xla"
    assert function is xla_cores.run_cores
    assert args == (b"user payload", None, True, "fork", "TPU", "all") and kwargs == {}


def test_the_xla_backend_is_chosen_for_device_xla_only():
    assert isinstance(backend_for(_plan()), xla_backend.XlaBackend)
    assert isinstance(backend_for(dataclasses.replace(_plan(), device_type="cpu")), ProcessBackend)


def test_launch_refused_up_front_when_the_kernel_holds_the_runtime(monkeypatch, torch_xla_installed):
    fake = types.SimpleNamespace(_XLAC=types.SimpleNamespace(_xla_runtime_is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch_xla", fake)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    hosts = _Hosts()
    with pytest.raises(RuntimeError, match="already initialised in this process.*Restart the kernel"):
        xla_backend.XlaBackend(hosts).check(_plan(xla=detect.XlaJob("TPU", None, 8)))
    assert hosts.started == []


def test_core_environment_is_torchrun_style():
    assert xla_cores._core_environment(3, 8, 3, 8) == {
        "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
        "GROUP_RANK": "0", "NOTEBOOK_ACCEL_DEVICE": "xla",
    }


def _core_failure(rank: int, headline: str, timestamp: float, traceback: str = "Traceback..."):
    from notebook_accel.wire import FailureRecord

    return FailureRecord(rank=rank, pid=100 + rank, exitcode=None, exc_type=headline.split(":")[0],
                         headline=f"XLA core {rank} failed: {headline}", traceback=traceback,
                         timestamp=timestamp)


def test_root_cause_is_the_earliest_core_failure(tmp_path):
    from notebook_accel.wire import encode

    (tmp_path / "error_3.msg").write_bytes(encode(_core_failure(3, "RuntimeError: peer gone", 2.0)))
    (tmp_path / "error_1.msg").write_bytes(encode(_core_failure(1, "ValueError: bad lr", 1.0)))
    failures = xla_cores._failures(tmp_path)
    assert [(f.rank, f.exc_type, f.timestamp) for f in failures] == [
        (1, "ValueError", 1.0), (3, "RuntimeError", 2.0)]
    error = xla_cores._user_facing(RuntimeError("peer gone"), failures)
    assert str(error) == "XLA core 1 failed: ValueError: bad lr (1 other core(s) failed after it)"


def test_a_failing_core_leaves_its_failure_record(monkeypatch, tmp_path):
    from notebook_accel.launch.handoff.payload import serialise_payload

    def train():
        raise ValueError("bad lr")

    monkeypatch.setattr(runtime, "ranks", lambda: (3, 4, 3))
    monkeypatch.setattr(runtime, "devices_per_process", lambda: 2)  # leaves the environment alone
    with pytest.raises(ValueError, match="bad lr"):
        xla_cores._core_main(3, serialise_payload(train, (), {}), str(tmp_path), False)
    (failure,) = xla_cores._failures(tmp_path)
    assert (failure.rank, failure.exc_type, failure.exitcode) == (3, "ValueError", None)
    assert failure.headline == "XLA core 3 failed: ValueError: bad lr"
    assert "in train" in failure.traceback and failure.timestamp > 0


def test_single_core_failure_keeps_its_type_and_shows_the_core_traceback():
    failure = _core_failure(2, "ValueError: bad lr", 0.5,
                            "Traceback (most recent call last):\n  cell 3\n")
    error = xla_cores._user_facing(ValueError("bad lr"), [failure])
    assert isinstance(error, ValueError)
    assert isinstance(error.__cause__, xla_cores.CoreTraceback)
    assert "cell 3" in str(error.__cause__)


def test_peer_downcast_bf16_becomes_torch_xla_setting():
    assert detect.bf16_environment("bf16", {"ACCELERATE_DOWNCAST_BF16": "true"}) == {
        "XLA_DOWNCAST_BF16": "1", "XLA_USE_BF16": "0"}
    assert detect.bf16_environment("bf16", {}) == {}
    assert detect.bf16_environment("no", {"ACCELERATE_DOWNCAST_BF16": "1"}) == {}


def test_optimizer_rebound_to_moved_parameters():
    before = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([before], lr=0.1, momentum=0.9)
    before.grad = torch.ones(2)
    optimizer.step()  # creates momentum state for `before`
    after = torch.nn.Parameter(torch.ones(2))
    runtime.rebind_parameters(optimizer, {id(before): after})
    assert optimizer.param_groups[0]["params"] == [after]
    assert after in optimizer.state and before not in optimizer.state


def test_moving_to_the_same_device_moves_nothing():
    model = torch.nn.Linear(2, 2)
    assert runtime.move_model(model, torch.device("cpu")) == {}


def test_other_cores_output_is_prefixed_line_by_line():
    import io

    sink = io.StringIO()
    stream = xla_cores.LinePrefixer(sink, "[core 3] ")
    stream.write("epoch 1")
    stream.write(": loss 0.5\nepoch 2\n")
    stream.write("a\rb\n")
    assert sink.getvalue() == "[core 3] epoch 1: loss 0.5\n[core 3] epoch 2\n[core 3] a\r[core 3] b\n"


def test_gradients_are_averaged_once_per_step_even_after_clipping(monkeypatch):
    calls = []
    fake_xm = types.SimpleNamespace(reduce_gradients=lambda opt: calls.append(opt))
    monkeypatch.setattr(runtime, "_xm", lambda: fake_xm)
    reducer, opt = runtime.GradientReducer(), object()
    reducer(opt)  # a plain step
    assert calls == [opt]
    reducer.reduce_now(opt)  # clip_grad_norm_ first...
    reducer.reduce_now(opt)
    reducer(opt)  # ...then the step: no second reduction
    assert calls == [opt, opt]
    reducer(opt)  # the next step reduces again
    assert calls == [opt, opt, opt]


# ---- the plan: device "xla" dispatches to torch_xla's launcher ------------------------------

def _make(**options):
    base = dict(num_processes=None, mixed_precision=None, use_port=None, master_addr="127.0.0.1",
                node_rank=0, num_nodes=1, start_method="auto", timeout=None, output="all",
                return_all=False, max_restarts=0, device="xla")
    return make_plan(**{**base, **options})


def test_plan_for_xla_is_one_host_worker_with_the_torch_xla_job(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    plan = _make()
    assert plan.device_type == "xla" and plan.num_processes == 1
    assert plan.xla == detect.XlaJob("CPU", None, 1)
    assert _make(num_processes=1).xla.nprocs == 1
    with pytest.raises(ValueError, match="num_processes=3 with device='xla'"):
        _make(num_processes=3)


def test_a_tpu_machine_launches_on_xla_by_default(monkeypatch):
    from notebook_accel.machine import hardware

    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.setattr(hardware, "detect", lambda: hardware.Hardware(cpu_count=4, tpu=True))
    monkeypatch.setattr(hardware, "tpu_present", lambda: True)
    plan = _make(device=None)
    assert plan.device_type == "xla" and plan.xla.pjrt_device == "TPU"


def test_config_file_with_distributed_type_xla_is_accepted(tmp_path):
    from notebook_accel.launch.planning.options import fill_options

    config = tmp_path / "default_config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: XLA\n")
    assert fill_options({"device": None, "num_processes": None}, config)["device"] == "xla"


def test_notebook_launcher_without_torch_xla_says_how_to_install(monkeypatch):
    from notebook_accel import notebook_launcher

    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setattr(xla_backend, "_torch_xla_installed", lambda: False)
    with pytest.raises(ImportError, match="needs torch_xla"):
        notebook_launcher(print, device="xla")


def test_clipping_on_several_xla_cores_clips_averaged_gradients_once(monkeypatch):
    from notebook_accel import Accelerator
    from notebook_accel.runtime.optim import AcceleratedOptimizer
    from notebook_accel.strategies.base import StrategyContext
    from notebook_accel.strategies.xla import XlaStrategy

    calls = []
    monkeypatch.setattr(runtime, "_xm", lambda: types.SimpleNamespace(
        reduce_gradients=lambda opt: calls.append("reduce")))
    accelerator = Accelerator(cpu=True)
    accelerator.strategy = XlaStrategy(StrategyContext.on_device(torch.device("xla", 0), num_processes=2))
    model = torch.nn.Linear(2, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = AcceleratedOptimizer(inner, accelerator.gradient_state, None, runtime.GradientReducer())
    accelerator._optimizers.append(optimizer)
    model(torch.ones(1, 2)).sum().backward()
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    assert calls == ["reduce"]  # averaged before clipping
    optimizer.step()
    assert calls == ["reduce"]  # not again in the step
    optimizer.step()
    assert calls == ["reduce", "reduce"]
