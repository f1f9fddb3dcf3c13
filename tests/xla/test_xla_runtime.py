"""The XLA path for real: torch_xla on one CPU device (``PJRT_DEVICE=CPU``).

Run by ``scripts/test_xla.sh`` in its own virtual environment (torch 2.9.0 +
torch_xla 2.9.0); skipped where torch_xla is missing. Two CPU devices deadlock in
torch_xla's first all_reduce, so multi-core runs cannot be tested on a CPU machine.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("torch_xla") is None:  # before touching the environment
    pytest.skip("needs torch_xla (run scripts/test_xla.sh)", allow_module_level=True)
os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402

from notebook_accel import WorkerError, notebook_launcher  # noqa: E402
from tests.kernel_harness import Kernel  # noqa: E402


def train(checkpoint_dir, mixed_precision="no", create_optimizer_first=True):
    """A user's loop with no XLA-specific line: prepare, train, save_state, load_state."""
    from pathlib import Path

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import Accelerator, set_seed

    set_seed(0)
    checkpoint_dir = Path(checkpoint_dir)
    accelerator = Accelerator(mixed_precision=mixed_precision)
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    dtypes = set()
    model[0].register_forward_hook(lambda module, args, out: dtypes.add(str(out.dtype)))
    if create_optimizer_first:  # the optimizer holds the CPU parameters until prepare
        optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    else:
        model = accelerator.prepare(model)
        optimizer = accelerator.prepare(torch.optim.Adam(model.parameters(), lr=0.02))
        loader = accelerator.prepare(loader)
    losses, devices = [], set()
    for epoch in range(4):
        total = torch.zeros((), device=accelerator.device)
        for xb, yb in loader:
            devices.add(str(xb.device))
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            optimizer.zero_grad()
            total += loss.detach()
        losses.append(float(total) / len(loader))
        accelerator.print(f"epoch {epoch}: loss {losses[-1]:.4f}")
    accelerator.save_state(checkpoint_dir)
    accelerator.save_model(model, checkpoint_dir / "safetensors")
    accelerator.save_model(model, checkpoint_dir / "bin", safe_serialization=False)
    accelerator.save({"weights": accelerator.unwrap_model(model).state_dict()}, checkpoint_dir / "w.pt")
    saved = {k: v.cpu().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    accelerator.load_state(checkpoint_dir)
    restored = accelerator.unwrap_model(model).state_dict()
    return {
        "losses": losses,
        "restored": all(torch.equal(saved[k], restored[k].cpu()) for k in saved),
        "devices": sorted(devices),
        "device": str(accelerator.device),
        "distributed_type": accelerator.distributed_type.value,
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "NOTEBOOK_ACCEL_DEVICE")},
        "dtypes": sorted(dtypes),
        "weight": restored["0.weight"],
    }


def _load_without_torch_xla(*paths):
    """Load each file in a fresh interpreter that never imports torch_xla."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from safetensors.torch import load_file\n"
        "for p in sys.argv[1:]:\n"
        "    load_file(p) if p.endswith('.safetensors') else torch.load(p, weights_only=True)\n"
        "assert 'torch_xla' not in sys.modules\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PJRT_DEVICE": ""})
    return done.stdout.strip() or done.stderr[-2000:]


def _check_training(result):
    losses = result["losses"]
    assert losses[-1] < 0.2 * losses[0], losses
    assert result["restored"]
    assert result["device"] == "xla:0" and result["devices"] == ["xla:0"]
    assert result["distributed_type"] == "XLA"
    assert result["weight"].device.type == "cpu"  # results come back on the CPU


@pytest.mark.parametrize("create_optimizer_first", [True, False])
def test_training_loop_on_xla_trains_saves_and_restores(tmp_path, capfd, create_optimizer_first):
    result = notebook_launcher(train, (tmp_path / "ckpt", "no", create_optimizer_first),
                               num_processes=1, device="xla")
    _check_training(result)
    assert result["env"] == {"RANK": "0", "WORLD_SIZE": "1", "NOTEBOOK_ACCEL_DEVICE": "xla"}
    assert "[rank 0] epoch 3: loss" in capfd.readouterr().out
    # Checkpoints and saved models hold CPU tensors: they load where torch_xla is not imported.
    ckpt = tmp_path / "ckpt"
    files = [ckpt / "optimizer.bin", ckpt / "bin" / "pytorch_model.bin", ckpt / "w.pt"]
    safetensors = [ckpt / "model.safetensors", ckpt / "safetensors" / "model.safetensors"]
    assert _load_without_torch_xla(*files, *safetensors) == "ok"
    rng = torch.load(ckpt / "random_states_0.pkl", weights_only=True)
    assert "xm_seed" in rng


def test_bf16_autocasts_on_xla(tmp_path):
    result = notebook_launcher(train, (tmp_path / "ckpt", "bf16"), num_processes=1, device="xla",
                               mixed_precision="bf16")
    _check_training(result)
    assert result["dtypes"] == ["torch.bfloat16"]


def _where():
    import os

    import torch

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    total = accelerator.reduce(torch.ones(3, device=accelerator.device), "sum")
    return {"pid": os.getpid(), "rank": os.environ["RANK"], "index": accelerator.process_index,
            "total": total, "gathered": accelerator.gather(torch.tensor(5.0, device=accelerator.device))}


def test_all_cores_path_runs_in_torch_xla_core_processes():
    # num_processes=None: torch_xla's launcher starts its core process(es) itself.
    value = notebook_launcher(_where, device="xla", return_all=True)
    assert len(value) == 1
    (core,) = value
    assert core["rank"] == "0" and core["index"] == 0
    assert core["pid"] != os.getpid()
    assert torch.equal(core["total"], torch.ones(3)) and torch.equal(core["gathered"], torch.tensor([5.0]))


def _helpers():
    import torch

    from notebook_accel.runtime import xla as runtime

    device = runtime.device()
    seed = runtime.rng_state()
    first = torch.rand(3, device=device).cpu()
    runtime.set_rng_state(seed)
    again = torch.rand(3, device=device).cpu()
    t = runtime.on_device(torch.arange(3.0), device)
    runtime.sync()
    return {
        "objects": runtime.gather_object({"core": 0}),
        "broadcast": runtime.broadcast_object_list(["a", 1]),
        "gathered": runtime.all_gather(t), "mean": runtime.all_reduce(t, "mean"),
        "cpu": runtime.to_cpu({"t": [t], "n": 1}), "rng_restored": torch.equal(first, again),
        "per_process": runtime.devices_per_process(), "ranks": runtime.ranks(),
    }


def test_runtime_helpers_on_one_xla_device():
    out = notebook_launcher(_helpers, device="xla", num_processes=1)
    assert out["objects"] == [{"core": 0}] and out["broadcast"] == ["a", 1]
    assert torch.equal(out["gathered"], torch.arange(3.0)) and torch.equal(out["mean"], torch.arange(3.0))
    assert out["cpu"]["n"] == 1 and out["cpu"]["t"][0].device.type == "cpu"
    assert out["rng_restored"] and out["per_process"] == 1 and out["ranks"] == (0, 1, 0)


def _fails(lr):
    raise ValueError(f"learning rate {lr} is too large")


@pytest.mark.parametrize("num_processes", [1, None])
def test_a_failing_core_is_a_worker_error_with_the_users_traceback(num_processes):
    with pytest.raises(WorkerError) as info:
        notebook_launcher(_fails, (10.0,), device="xla", num_processes=num_processes)
    error = info.value
    assert "ValueError: learning rate 10.0 is too large" in str(error)
    assert "in _fails" in error.remote_traceback
    assert "torch_xla/_internal" not in error.remote_traceback
    assert "run_cores" not in error.remote_traceback


def _hangs(path):
    import os
    import time

    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def test_timeout_stops_the_core_processes_too(tmp_path):
    import time

    import psutil

    with pytest.raises(WorkerError, match="timed out|timeout"):
        notebook_launcher(_hangs, (str(tmp_path / "pid"),), device="xla", timeout=20)
    core = int((tmp_path / "pid").read_text())
    assert core != os.getpid()
    deadline = time.monotonic() + 5  # SIGKILL went to the host worker's whole process group
    while psutil.pid_exists(core) and psutil.Process(core).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "a core process outlived the job"
        time.sleep(0.05)


def test_num_processes_torch_xla_cannot_run_is_refused_before_any_worker():
    with pytest.raises(ValueError, match=r"num_processes=2 with device='xla', but this CPU has 1 "
                                         r"core\. Valid here: num_processes=None \(every core\) or 1"):
        notebook_launcher(_fails, (1.0,), device="xla", num_processes=2)


@pytest.mark.slow
def test_in_a_kernel_function_and_magic_train_then_launch_refused_once_kernel_holds_runtime(
        tmp_path):
    kernel = Kernel(extra_env={"PJRT_DEVICE": "CPU"})
    try:
        kernel.ok("from notebook_accel import notebook_launcher\n"
                  "from tests.xla.test_xla_runtime import train")
        result = kernel.ok(f"r = notebook_launcher(train, ({str(tmp_path / 'k')!r},), "
                           "device='xla', num_processes=1)\nprint(r['losses'])", timeout=300)
        assert "[rank 0] epoch 3: loss" in result.stdout
        kernel.ok("%load_ext notebook_accel")
        magic = kernel.ok("%%accelerate --device xla -n 1\n"
                          "from notebook_accel import Accelerator\n"
                          "accelerator = Accelerator()\n"
                          "print('cell on', accelerator.device, accelerator.distributed_type.value)",
                          timeout=300)
        assert "cell on xla:0 XLA" in magic.stdout
        kernel.ok("import torch_xla\nx = torch_xla.device()  # the kernel now holds the runtime")
        refused = kernel.run("notebook_launcher(train, ('x',), device='xla', num_processes=1)")
        assert refused.error is not None and refused.error["ename"] == "RuntimeError"
        assert "already initialised" in refused.error["evalue"]
        assert "Restart the kernel" in refused.error["evalue"]
    finally:
        kernel.shutdown()
