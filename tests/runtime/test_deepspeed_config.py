"""DeepSpeed's configuration in fresh interpreters: importing us and building the plugin never imports
deepspeed, and one process trains through DeepSpeed (a one-process group)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest


def test_import_and_plugin_never_import_deepspeed():
    code = ("import sys, notebook_accel\nfrom notebook_accel import Accelerator, DeepSpeedPlugin\n"
            "DeepSpeedPlugin(zero_stage=3)\nAccelerator()\nassert 'deepspeed' not in sys.modules, 'imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_one_process_trains_through_deepspeed_too():
    """One process (ZeRO-Offload on one GPU is the peer's use case): a one-process group, the engine,
    a frozen teacher in the same prepare call placed, not wrapped. In a subprocess: it creates a group."""
    code = textwrap.dedent("""
        import warnings; warnings.simplefilter("ignore")
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        from notebook_accel import Accelerator, DeepSpeedPlugin
        acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu"))
        torch.manual_seed(0)
        student, teacher = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1).requires_grad_(False)
        data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        opt = torch.optim.SGD(student.parameters(), lr=0.1)
        model, opt, loader, teacher = acc.prepare(student, opt, DataLoader(data, batch_size=4), teacher)
        for x, y in loader:
            acc.backward(torch.nn.functional.mse_loss(model(x), y + teacher(x)))
            opt.step()
        print(acc.distributed_type.value, acc.num_processes, type(model).__name__, type(teacher).__name__,
              acc.state.deepspeed_plugin is acc.deepspeed_plugin)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "DEEPSPEED 1 DeepSpeedEngine Linear True" in out.stdout
