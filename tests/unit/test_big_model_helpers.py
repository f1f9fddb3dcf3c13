"""The peer's ``accelerate.utils.modeling`` helpers (``big_model/modeling.py``) on small models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from notebook_accel import disk_offload
from notebook_accel.utils import (
    align_module_device,
    check_device_map,
    clean_device_map,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_non_persistent_buffers,
    get_state_dict_offloaded_model,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1, self.batchnorm, self.linear2 = nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 5)

    def forward(self, x):
        return self.linear2(self.batchnorm(self.linear1(x)))


def test_sizes():
    assert (dtype_byte_size(torch.bool), dtype_byte_size(torch.bfloat16), dtype_byte_size(torch.float64)) == (1 / 8, 2, 8)
    assert convert_file_size_to_int("2GiB") == 2 * 2**30 and convert_file_size_to_int("1.5GB") == 1.5e9
    for bad in ("5MBB", "5k0MB", "-1GB"):
        with pytest.raises(ValueError):
            convert_file_size_to_int(bad)
    model = Net()
    model.register_buffer("extra", torch.zeros(10, 10))
    assert compute_module_total_buffer_size(model) == 400 + 16 + 16 + 8
    assert compute_module_total_buffer_size(model, dtype=torch.float16) == 200 + 8 + 8 + 8


def test_tied_parameters_are_found_and_retied():
    model = nn.Sequential(*(nn.Linear(2, 2) for _ in range(5)))
    assert find_tied_parameters(model) == []
    model[3].weight = model[0].weight
    model[4].weight = model[1].weight
    model[2].weight = model[1].weight
    assert find_tied_parameters(model) == [["0.weight", "3.weight"], ["1.weight", "2.weight", "4.weight"]]
    fresh = nn.Sequential(*(nn.Linear(2, 2) for _ in range(5)))
    retie_parameters(fresh, find_tied_parameters(model))
    assert fresh[0].weight is fresh[3].weight and fresh[1].weight is fresh[4].weight is fresh[2].weight


def test_device_maps_are_cleaned_and_checked():
    assert clean_device_map({"a": 0, "b": 0, "c": 0}) == {"": 0}
    assert clean_device_map({"a.x": 0, "a.y": 0, "b.x": 1, "b.y": 1, "c": 1}) == {"a": 0, "b": 1, "c": 1}
    assert clean_device_map({"a.x": 0, "a.y": 0, "b.x.0": 1, "b.x.1": 1, "b.y.0": 2, "b.y.1": 2, "c": 2}) == {
        "a": 0, "b.x": 1, "b.y": 2, "c": 2}
    check_device_map(Net(), {"": 0})
    with pytest.raises(ValueError, match="batchnorm.weight"):
        check_device_map(Net(), {"linear1": 0, "linear2": 1})
    with pytest.warns(UserWarning, match=r"do not match any submodules.*'nowhere'"):
        check_device_map(Net(), {"": "cpu", "nowhere": 0})


def test_a_modules_tensors_without_changing_it():
    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mask", torch.ones(1))
            self.sub = nn.Module()
            self.sub.register_buffer("mask", torch.ones(1), persistent=False)

    model = Root()
    assert get_non_persistent_buffers(model) == set() and get_non_persistent_buffers(model, recurse=True) == {"mask"}
    assert [n for n, _ in named_module_tensors(nn.BatchNorm1d(2), include_buffers=False)] == ["weight", "bias"]
    list(named_module_tensors(model, recurse=True, remove_non_persistent=True))
    assert "mask" in model.state_dict() and model._non_persistent_buffers_set == set()


def test_set_module_tensor_to_device_moves_casts_and_checks():
    model = Net()
    set_module_tensor_to_device(model, "linear1.weight", "meta")
    assert model.linear1.weight.is_meta and isinstance(model.linear1.weight, nn.Parameter)
    with pytest.raises(ValueError, match="meta device, we need a `value`"):
        set_module_tensor_to_device(model.linear1, "weight", "cpu")
    set_module_tensor_to_device(model.linear1, "weight", "cpu", value=torch.ones(4, 3), dtype=torch.float16)
    assert model.linear1.weight.dtype == torch.float16 and model.linear1.weight.requires_grad
    set_module_tensor_to_device(model, "batchnorm.running_mean", "cpu", value=torch.full((4,), 2.0))
    assert model.batchnorm.running_mean.sum() == 8
    with pytest.raises(ValueError, match=r'shape torch.Size\(\[2, 2\]\) in "weight"'):
        set_module_tensor_to_device(model, "linear2.weight", "cpu", value=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="does not have a parameter or a buffer named nope"):
        set_module_tensor_to_device(model, "nope", "cpu")


def test_an_offloaded_modules_weights_are_real_inside_align_module_device(tmp_path):
    torch.manual_seed(0)
    model = Net().eval()
    expected = model.state_dict()
    disk_offload(model, tmp_path, execution_device=torch.device("cpu"))
    assert model.batchnorm.weight.is_meta
    with align_module_device(model.batchnorm):
        assert torch.equal(model.batchnorm.weight, expected["batchnorm.weight"]) and model.linear1.weight.is_meta
    assert model.batchnorm.weight.is_meta
    state = get_state_dict_offloaded_model(model)
    assert state.keys() == expected.keys() and all(torch.equal(state[k], v) for k, v in expected.items())
    plain = Net()
    with align_module_device(plain.linear1, execution_device="meta"):
        assert plain.linear1.weight.is_meta and not plain.linear2.weight.is_meta
    assert not plain.linear1.weight.is_meta


def test_the_execution_device_hook_walks_the_model_once(monkeypatch):
    """Which modules hold state is found from one state_dict() of the model (each module's
    state_dict runs once, not once per level above it: that was O(parameters x depth)), and
    the hooks go where a non-empty state_dict() says."""
    from notebook_accel.big_model.align_hooks import attach_execution_device_hook

    class Extra(nn.Module):
        def get_extra_state(self):
            return {"x": 1}

    def chain(depth):
        root = node = nn.Module()
        for _ in range(depth):
            node.block = nn.Sequential(nn.Linear(2, 2), nn.Identity())
            node.inner = nn.Module()
            node = node.inner
        return root

    model = chain(40)
    quiet, loud = nn.Module(), nn.Module()
    quiet.register_buffer("scratch", torch.zeros(1), persistent=False)  # no state
    loud.register_buffer("stats", torch.zeros(1))
    nobias = nn.Linear(2, 2, bias=False)  # a None parameter, and a weight
    model.quiet, model.loud, model.extra, model.empty, model.nobias = (
        quiet, loud, Extra(), nn.Sequential(), nobias)
    expected = {name for name, m in model.named_modules() if m.state_dict()}
    calls = []
    original = nn.Module.state_dict
    monkeypatch.setattr(nn.Module, "state_dict", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    attach_execution_device_hook(model, torch.device("cpu"))
    hooked = {name for name, m in model.named_modules() if hasattr(m, "_hf_hook")}
    assert len(calls) == len(list(model.modules())) and hooked == expected
    assert {"quiet", "empty"}.isdisjoint(hooked) and {"", "loud", "extra", "nobias"} <= hooked


PEER_DISK_OFFLOAD = '''
import sys, torch
from torch import nn
from accelerate import disk_offload
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
model[0].register_buffer("scale", torch.tensor([0.5, 3.25], dtype=torch.bfloat16))
disk_offload(model, sys.argv[1], offload_buffers=True)
x = torch.arange(6.0).reshape(2, 3)
torch.save({"x": x, "y": model(x).detach().clone()}, sys.argv[1] + "/expected.pt")
'''


def test_disk_offload_reads_the_folder_the_peer_offloaded_into(tmp_path):
    """The peer's disk_offload folder (index.json and one .dat file a tensor, a bf16 buffer among them), given
    as offload_dir: a model on meta runs on the weights it holds, mapped where they lie, nothing
    rewritten; a model of other shapes is refused, naming the tensor."""
    import importlib.util
    import subprocess
    import sys

    from notebook_accel.big_model.dat_offload import stored_tensors
    from notebook_accel.big_model.safetensors_io import map_tensors

    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("the peer (accelerate) is not installed: pip install -e .[bench]")
    folder = tmp_path / "offload"
    done = subprocess.run([sys.executable, "-c", PEER_DISK_OFFLOAD, str(folder)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    expected = torch.load(folder / "expected.pt")
    before = sorted(p.name for p in folder.iterdir())
    assert "index.json" in before and "0.weight.dat" in before

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
        model[0].register_buffer("scale", torch.empty(2, dtype=torch.bfloat16))
    disk_offload(model, folder, offload_buffers=True)
    assert torch.equal(model(expected["x"]), expected["y"])
    assert sorted(p.name for p in folder.iterdir()) == before  # read where it lies: nothing written
    stored = stored_tensors(folder)
    assert map_tensors({"s": stored["0.scale"]})["s"].tolist() == [0.5, 3.25]  # bf16, which numpy lacks

    with torch.device("meta"):
        other = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2))
    with pytest.raises(ValueError, match=r"0\.weight with shape \(4, 3\).*\(5, 3\)"):
        disk_offload(other, folder)
