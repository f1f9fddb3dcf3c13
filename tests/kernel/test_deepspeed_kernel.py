"""DeepSpeed ZeRO-3 from a real Jupyter kernel: one training function, only the config file
changed (DDP -> FSDP -> ZeRO-3), under ``notebook_launcher``, ``%%accelerate`` and ``torchrun``.

Skipped, saying why, where deepspeed is not installed.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from notebook_accel.config import load_config
from notebook_accel.launch.planning.options import worker_strategy_environment
from tests.runtime_support import run_torchrun

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                       reason="deepspeed is not installed (pip install -e '.[deepspeed]', DS_BUILD_OPS=0)"),
]

CONFIGS = {
    "ddp": "distributed_type: MULTI_CPU\nuse_cpu: true\nnum_processes: 2\n",
    "fsdp": "distributed_type: FSDP\nuse_cpu: true\nnum_processes: 2\nfsdp_config:\n"
            "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 100\n",
    "zero3": "distributed_type: DEEPSPEED\nuse_cpu: true\nnum_processes: 2\ndeepspeed_config:\n"
             "  zero_stage: 3\n  zero3_save_16bit_model: true\n",
}

DEFINITIONS = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from notebook_accel import Accelerator

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

def held(p):
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor.numel()
    return (p.to_local() if hasattr(p, "to_local") else p).numel()

def train():
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g))
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=4))
    local = sum(held(p) for p in model.parameters())
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    total = accelerator.reduce(loss.detach(), "mean")
    plain = accelerator.unwrap_model(model)
    print(f"type {accelerator.distributed_type.value} holds {local} loss {round(float(total), 6)}", flush=True)
    return plain
"""


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("strategies")
    paths = {}
    for name, text in CONFIGS.items():
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(text)
    return paths


def _loss(stdout: str, rank: int = 0) -> str:
    line = next(line for line in stdout.splitlines() if line.startswith(f"[rank {rank}] type"))
    return line.split("loss ")[1]


def test_launcher_runs_the_same_function_with_ddp_fsdp_and_zero3(kernel, configs):
    kernel.ok(DEFINITIONS)
    losses = {}
    for name, kind, holds in (("ddp", "MULTI_CPU", 212), ("fsdp", "FSDP", 106), ("zero3", "DEEPSPEED", 106)):
        result = kernel.ok(f"trained = notebook_launcher(train, config_file={str(configs[name])!r})\n"
                           "print('got', type(trained).__name__, sum(p.numel() for p in trained.parameters()))",
                           timeout=240)
        assert f"[rank 0] type {kind} holds {holds} loss" in result.stdout, result.stdout
        assert f"[rank 1] type {kind} holds {holds} loss" in result.stdout, result.stdout
        assert "got Net 212" in result.stdout  # a plain, full module back in the kernel
        losses[name] = float(_loss(result.stdout))
    assert abs(losses["zero3"] - losses["ddp"]) <= 1e-5 and abs(losses["fsdp"] - losses["ddp"]) <= 1e-5, losses


def test_cell_magic_with_the_zero3_config(kernel, configs):
    kernel.ok(DEFINITIONS + "\nget_ipython().run_line_magic('load_ext', 'notebook_accel')")
    cell = textwrap.dedent(f"""\
        %%accelerate --config {configs['zero3']} --pull plain
        plain = train()
        """)
    result = kernel.ok(cell, timeout=240)
    assert "[rank 1] type DEEPSPEED holds 106 loss" in result.stdout, result.stdout
    assert kernel.value("type(plain).__name__") == "Net"
    assert kernel.value("plain(torch.ones(1, 8)).shape == (1, 4)") is True


def test_returning_the_engine_says_what_to_return(kernel, configs):
    kernel.ok(DEFINITIONS + "\ndef raw():\n    acc = Accelerator()\n    m = Net()\n"
              "    return acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1))[0]\n")
    result = kernel.run(f"notebook_launcher(raw, config_file={str(configs['zero3'])!r})", timeout=240)
    assert result.error is not None and result.error["ename"] == "WorkerError", result.traceback
    assert "DeepSpeed engine cannot leave its worker" in result.traceback
    assert "accelerator.unwrap_model(model)" in result.traceback


def test_torchrun_runs_the_same_function_with_the_zero3_configs_variables(configs, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DEFINITIONS + "\ntrain()\n")
    env = worker_strategy_environment(load_config(configs["zero3"]))  # what `accelerate launch` would set
    returncode, output = run_torchrun([str(script)], timeout=200, extra_env=env)
    assert returncode == 0, output[-4000:]
    # torchrun relays both ranks to one stdout: the other rank's output may cut into a line
    assert output.count("DEEPSPEED holds 106 loss") == 2, output[-4000:]


def test_the_cell_says_when_deepspeed_compiles_its_ops(kernel, configs, tmp_path):
    kernel.ok(DEFINITIONS + "\nimport os\ncache = os.environ['TORCH_EXTENSIONS_DIR']  # the suite's (tests/config_isolation.py)"
              f"\nos.environ['TORCH_EXTENSIONS_DIR'] = {str(tmp_path / 'ext')!r}")
    try:  # an empty build cache: DeepSpeed compiles its CPU collectives (~30-60 s) in the first launch
        result = kernel.ok(f"notebook_launcher(train, config_file={str(configs['zero3'])!r})", timeout=280)
    finally:
        kernel.ok("os.environ['TORCH_EXTENSIONS_DIR'] = cache")
    assert "DeepSpeed is compiling its C++ ops for this machine (deepspeed_shm_comm)" in result.stdout, result.stdout
    assert "[rank 0] type DEEPSPEED holds 106" in result.stdout
    again = kernel.ok(f"notebook_launcher(train, config_file={str(configs['zero3'])!r})", timeout=240)
    assert "compiling" not in again.stdout  # the suite's cache already has the build
