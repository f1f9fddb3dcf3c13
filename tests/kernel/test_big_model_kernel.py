"""Big-model inference from a notebook: a real Jupyter kernel loads with device_map="auto"."""

from __future__ import annotations

import pytest

from tests.kernel_harness import Kernel

CELL = """
import torch
from torch import nn
from safetensors.torch import save_file
from notebook_accel import init_empty_weights, load_checkpoint_and_dispatch, compute_module_sizes

class Layer(nn.Module):          # defined in the notebook itself
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 256), nn.Linear(256, 64)
    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))

def build():
    return nn.Sequential(*[Layer() for _ in range(12)])

torch.manual_seed(0)
reference = build().eval()
save_file(reference.state_dict(), {path!r})
with init_empty_weights():
    model = build()
budget = compute_module_sizes(model)[""] // 3
model = load_checkpoint_and_dispatch(model, {path!r}, device_map="auto",
                                     max_memory={{"cpu": budget}}, no_split_module_classes=["Layer"])
x = torch.randn(3, 64)
with torch.no_grad():
    same = torch.equal(model(x), reference(x))
placed = sorted(set(map(str, model.hf_device_map.values())))
"""


@pytest.fixture
def kernel():
    k = Kernel()
    yield k
    k.shutdown()


def test_device_map_auto_in_a_real_kernel(kernel, tmp_path):
    kernel.ok(CELL.format(path=str(tmp_path / "model.safetensors")), timeout=120)
    assert kernel.value("same") is True
    assert kernel.value("placed") == ["cpu", "disk"]
    # the way back, in the same kernel
    kernel.ok("model.to('cpu')\nwith torch.no_grad():\n    back = torch.equal(model(x), reference(x))")
    assert kernel.value("back") is True
    assert kernel.value("hasattr(model, 'hf_device_map')") is False
