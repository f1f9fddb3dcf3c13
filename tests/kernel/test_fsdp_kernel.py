"""FSDP2 from a real Jupyter kernel: the config file turns it on, the same training function
runs under ``notebook_launcher`` and ``%%accelerate``, and the notebook gets a plain module back."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.slow

FSDP_YAML = """\
distributed_type: FSDP
use_cpu: true
num_processes: 2
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: SIZE_BASED_WRAP
  fsdp_min_num_params: 100
  fsdp_state_dict_type: SHARDED_STATE_DICT
"""

DEFINITIONS = """
import torch
from notebook_accel import Accelerator

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

def train(give_back="plain"):
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(accelerator.process_index))
    accelerator.backward(model(x).pow(2).mean())
    opt.step()
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    print("type", accelerator.distributed_type.value, "holds", local, "of", sum(p.numel() for p in model.parameters()))
    return accelerator.unwrap_model(model) if give_back == "plain" else model
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("fsdp_kernel") / "fsdp.yaml"
    path.write_text(FSDP_YAML)
    return path


@pytest.fixture(scope="module")
def ddp_config(config):
    path = config.with_name("ddp.yaml")
    path.write_text("distributed_type: MULTI_CPU\nuse_cpu: true\nnum_processes: 2\n")
    return path


def test_only_the_config_file_changes_between_ddp_and_fsdp(kernel, ddp_config):
    kernel.ok(DEFINITIONS)
    result = kernel.ok(f"trained = notebook_launcher(train, config_file={str(ddp_config)!r})", timeout=180)
    assert "[rank 0] type MULTI_CPU holds 212 of 212" in result.stdout


def test_launcher_with_fsdp_config_returns_a_plain_full_module(kernel, config):
    kernel.ok(DEFINITIONS)
    result = kernel.ok(f"trained = notebook_launcher(train, config_file={str(config)!r})\n"
                       "print('got', type(trained).__name__, sorted({type(p).__name__ for p in trained.parameters()}),"
                       " sum(p.numel() for p in trained.parameters()))", timeout=180)
    assert "[rank 0] type FSDP holds 106 of 212" in result.stdout  # really sharded: half each
    assert "[rank 1] type FSDP holds 106 of 212" in result.stdout
    assert "got Net ['Parameter'] 212" in result.stdout
    assert kernel.value("trained(torch.ones(1, 8)).shape == (1, 4)") is True


def test_returning_the_sharded_module_says_what_to_return(kernel, config):
    kernel.ok(DEFINITIONS)
    result = kernel.run(f"notebook_launcher(train, ('raw',), config_file={str(config)!r})", timeout=180)
    assert result.error is not None and result.error["ename"] == "WorkerError", result.traceback
    assert "sharded by FSDP cannot leave its worker" in result.traceback
    assert "return accelerator.unwrap_model(model)" in result.traceback


def test_same_function_under_the_cell_magic_with_fsdp_flag(kernel, ddp_config):
    kernel.ok(DEFINITIONS + "\nget_ipython().run_line_magic('load_ext', 'notebook_accel')")
    cell = textwrap.dedent(f"""\
        %%accelerate --config {ddp_config} --fsdp --pull plain,sharded
        plain = train()
        sharded = train("raw")
        """)
    result = kernel.ok(cell, timeout=180)
    assert "[rank 1] type FSDP holds 106 of 212" in result.stdout
    assert kernel.value("type(plain).__name__") == "Net"
    assert "sharded (TypeError: a FSDPNet sharded by FSDP cannot leave its worker" in result.stderr
