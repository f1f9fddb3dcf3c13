"""Loading checkpoints straight into place, dispatching, offloading, and the way back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from notebook_accel import (
    compute_module_sizes,
    cpu_offload,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    undispatch_model,
)
from notebook_accel.big_model.devices import use_devices
from tests.big_model_support import FakeGPUs, Net, TiedLM, eager, random_state, write_sharded

WIDTH, BLOCKS = 32, 12


@pytest.fixture(scope="module")
def state():
    with init_empty_weights():
        model = Net(WIDTH, BLOCKS)
    return random_state(model)


@pytest.fixture(scope="module")
def reference(state):
    torch.manual_seed(1)
    x = torch.randn(5, WIDTH)
    with torch.no_grad():
        return x, eager(Net, state, width=WIDTH, blocks=BLOCKS)(x)


def empty() -> Net:
    with init_empty_weights():
        return Net(WIDTH, BLOCKS)


def third(model) -> int:
    return compute_module_sizes(model)[""] // 3


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def make_checkpoint(kind: str, state, root: Path) -> Path:
    if kind == "file":
        save_file(state, root / "model.safetensors")
        return root / "model.safetensors"
    if kind == "sharded":
        return write_sharded(state, root / "sharded", 3)
    if kind == "index":
        return write_sharded(state, root / "sharded", 3) / "model.safetensors.index.json"
    if kind == "bin-sharded":
        names = list(state)
        halves = {"pytorch_model-00001-of-00002.bin": names[: len(names) // 2],
                  "pytorch_model-00002-of-00002.bin": names[len(names) // 2:]}
        for file, part in halves.items():
            torch.save({n: state[n] for n in part}, root / file)
        weight_map = {n: file for file, part in halves.items() for n in part}
        (root / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
        return root
    torch.save(state, root / "pytorch_model.bin")
    return root / "pytorch_model.bin" if kind == "bin" else root


@pytest.mark.parametrize("kind", ["file", "sharded", "index", "bin", "bin-folder", "bin-sharded"])
def test_every_checkpoint_layout_runs_bitwise_equal(kind, state, reference, tmp_path):
    checkpoint = make_checkpoint(kind, state, tmp_path)
    offload = tmp_path / "offload"
    model = empty()
    model = load_checkpoint_and_dispatch(
        model, checkpoint, device_map="auto", max_memory={"cpu": third(model)},
        no_split_module_classes=["Block"], offload_folder=offload,
    )
    assert {"cpu", "disk"} <= set(model.hf_device_map.values())
    x, expected = reference
    with torch.no_grad():
        assert torch.equal(model(x), expected)
        assert torch.equal(model(x), expected)
    written = folder_bytes(offload) if offload.exists() else 0
    if kind.startswith("bin"):
        assert written > 0  # a .bin file's disk part is rewritten as safetensors
    else:
        assert written == 0  # streamed from the checkpoint itself
    assert all(p.is_meta for n, p in model.named_parameters() if model.hf_device_map.get(n.rsplit(".", 2)[0]) == "disk")


def test_bin_disk_part_needs_an_offload_folder(state, tmp_path):
    checkpoint = make_checkpoint("bin", state, tmp_path)
    model = empty()
    with pytest.raises(ValueError, match="offload_folder"):
        load_checkpoint_and_dispatch(model, checkpoint, device_map="auto", max_memory={"cpu": third(model)},
                                     no_split_module_classes=["Block"])


def test_dtype_casts_weights_on_every_tier(state, reference, tmp_path):
    checkpoint = make_checkpoint("sharded", state, tmp_path)
    model = empty()
    model = load_checkpoint_and_dispatch(model, checkpoint, device_map="auto", dtype=torch.bfloat16,
                                         max_memory={"cpu": third(model) // 2}, no_split_module_classes=["Block"])
    x, _ = reference
    bf16 = eager(Net, state, width=WIDTH, blocks=BLOCKS).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(model(x.bfloat16()), bf16(x.bfloat16()))
    assert model.inp.weight.dtype == torch.bfloat16


def test_tied_weights_stay_tied_through_offload_and_back(tmp_path):
    with init_empty_weights():
        model = TiedLM()
    state = random_state(model)
    save_file(state, tmp_path / "model.safetensors")  # holds embed.weight only, as the Hub's files do
    ids = torch.arange(40).reshape(4, 10)
    with torch.no_grad():
        expected = eager(TiedLM, state)(ids)
    plan = {"embed": "disk", "blocks": "cpu", "head": "disk"}
    model = load_checkpoint_and_dispatch(model, tmp_path / "model.safetensors", device_map=plan)
    assert model.embed.weight.is_meta and not model.blocks[0].fc1.weight.is_meta
    with torch.no_grad():
        assert torch.equal(model(ids), expected)
    model.to("cpu")  # the way back
    assert model.head.weight is model.embed.weight and not model.embed.weight.is_meta
    with torch.no_grad():
        assert torch.equal(model(ids), expected)


def test_way_back_undispatch_and_to(state, reference, tmp_path):
    checkpoint = make_checkpoint("sharded", state, tmp_path)
    model = empty()
    model = load_checkpoint_and_dispatch(model, checkpoint, device_map="auto", max_memory={"cpu": third(model)},
                                         no_split_module_classes=["Block"])
    x, expected = reference
    undispatch_model(model)
    assert not hasattr(model, "hf_device_map")
    assert not any(p.is_meta for p in model.parameters())
    assert not model.blocks[0]._forward_pre_hooks and not model.blocks[-1]._forward_hooks
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    with pytest.raises(ValueError, match="not dispatched"):
        undispatch_model(model)
    # dispatch again (disk weights from memory now need a folder), then .to(dtype) turns it back
    dispatch_model(model, {"": "cpu", "blocks.5": "disk"}, offload_dir=tmp_path / "again")
    assert model.blocks[5].fc1.weight.is_meta
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    model.to(torch.float64)
    assert model.blocks[5].fc1.weight.dtype == torch.float64 and not hasattr(model, "hf_device_map")


def test_cpu_offload_and_disk_offload_bitwise_equal(state, reference, tmp_path):
    x, expected = reference
    model = cpu_offload(eager(Net, state, width=WIDTH, blocks=BLOCKS), execution_device="cpu")
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    model = disk_offload(eager(Net, state, width=WIDTH, blocks=BLOCKS), tmp_path / "off", execution_device="cpu")
    assert all(p.is_meta for p in model.parameters())
    assert folder_bytes(tmp_path / "off") >= compute_module_sizes(empty())[""] - 4 * WIDTH
    with torch.no_grad():
        assert torch.equal(model(x), expected)
        assert torch.equal(model(x), expected)
    assert all(p.is_meta for p in model.parameters())  # weights are let go after each module


def test_cpu_offload_to_a_gpu_through_the_device_seam(state, reference):
    """Weights stay in CPU memory and are copied to the (pretend) GPU module by module."""
    x, expected = reference
    with use_devices(FakeGPUs(1)):
        model = cpu_offload(eager(Net, state, width=WIDTH, blocks=BLOCKS), execution_device=0)
        assert all(p.is_meta for p in model.parameters())
        with torch.no_grad():
            assert torch.equal(model(x), expected)
        assert all(p.is_meta for p in model.parameters())
        model.to("cpu")
    assert not any(p.is_meta for p in model.parameters())


def test_gpu_placement_through_the_device_seam(state, reference, tmp_path):
    """cuda:N placement, exercised with pretend GPUs whose memory is the CPU's."""
    checkpoint = make_checkpoint("sharded", state, tmp_path)
    model = empty()
    size = compute_module_sizes(model)[""]
    gpus = FakeGPUs(2)
    with use_devices(gpus):
        model = load_checkpoint_and_dispatch(
            model, checkpoint, device_map="sequential", no_split_module_classes=["Block"],
            max_memory={0: size // 4, 1: size // 4, "cpu": size // 4},
        )
        assert set(model.hf_device_map.values()) == {0, 1, "cpu", "disk"}
        assert gpus.placed == {0, 1}
        x, expected = reference
        with torch.no_grad():
            assert torch.equal(model(x), expected)
    # the planner's GPU keys are checked against the real machine when placing
    with pytest.raises(ValueError, match="GPU"):
        dispatch_model(empty(), {"": torch.cuda.device_count()})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_gpu_placement(state, reference, tmp_path):
    checkpoint = make_checkpoint("sharded", state, tmp_path)
    model = empty()
    size = compute_module_sizes(model)[""]
    model = load_checkpoint_and_dispatch(model, checkpoint, device_map="auto", no_split_module_classes=["Block"],
                                         max_memory={0: size // 3, "cpu": size // 3})
    assert model.inp.weight.device.type == "cuda"
    x, expected = reference
    with torch.no_grad():
        out = model(x)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_a_tensor_nobody_fills_is_named_at_load_time(state, tmp_path):
    """Peer #3617: meta tensors surfaced later as 'Cannot copy out of meta tensor'."""
    partial = {k: v for k, v in state.items() if k != "blocks.3.fc2.weight"}
    save_file(partial, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"blocks\.3\.fc2\.weight"):
        load_checkpoint_in_model(empty(), tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected"):
        load_checkpoint_in_model(empty(), _with_extra(state, tmp_path), strict=True)


def _with_extra(state, tmp_path) -> Path:
    save_file({**state, "ghost": torch.zeros(1)}, tmp_path / "extra.safetensors")
    return tmp_path / "extra.safetensors"


def test_device_map_must_cover_every_tensor():
    model = empty()
    with pytest.raises(ValueError, match="scale"):
        dispatch_model(model, {"inp": "cpu", "blocks": "cpu", "out": "cpu"})
    plan = infer_auto_device_map(model, max_memory={"cpu": "1GiB"})
    assert plan == {"": "cpu"}


def test_engine_imports_no_ipython():
    code = "import notebook_accel.big_model, sys; assert 'IPython' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_buffers_stay_on_the_main_device_unless_offloaded(offload_buffers, state, reference, tmp_path):
    checkpoint = make_checkpoint("file", state, tmp_path)
    model = load_checkpoint_and_dispatch(empty(), checkpoint, device_map={"": "disk"},
                                         offload_buffers=offload_buffers)
    assert model.inp.weight.is_meta
    assert model.scale.is_meta is offload_buffers
    x, expected = reference
    with torch.no_grad():
        assert torch.equal(model(x), expected)


def _infer_in_worker(checkpoint: str, budget: int, state: dict, x: torch.Tensor) -> tuple[int, bool, bool]:
    from notebook_accel import PartialState

    model = load_checkpoint_and_dispatch(empty(), checkpoint, device_map="auto", max_memory={"cpu": budget},
                                         no_split_module_classes=["Block"])
    with torch.no_grad():  # compared in the worker: its thread count sets the sums' order
        same = torch.equal(model(x), eager(Net, state, width=WIDTH, blocks=BLOCKS)(x))
    return PartialState().process_index, "disk" in model.hf_device_map.values(), same


def test_works_inside_launched_workers(state, reference, tmp_path):
    from notebook_accel import notebook_launcher

    checkpoint = make_checkpoint("sharded", state, tmp_path)
    results = notebook_launcher(_infer_in_worker, args=(str(checkpoint), third(empty()), state, reference[0]),
                                num_processes=2, return_all=True)
    assert results == [(0, True, True), (1, True, True)]


def test_dispatching_unloaded_weights_names_them():
    """Peer #3617: a one-device map ran model.to() over meta tensors ('Cannot copy out of meta')."""
    with pytest.raises(ValueError, match=r"inp\.weight is still on the meta device"):
        dispatch_model(empty(), {"": "cpu"})


def test_dispatch_with_another_map_than_loading(state, reference, tmp_path):
    """Weights the loader left on disk become resident when dispatch places them on the CPU."""
    checkpoint = make_checkpoint("file", state, tmp_path)
    model = empty()
    load_checkpoint_in_model(model, checkpoint, device_map={"": "cpu", "blocks": "disk"})
    assert model.blocks[0].fc1.weight.is_meta
    dispatch_model(model, {"": "cpu", "blocks.0": "disk"})
    assert not model.blocks[1].fc1.weight.is_meta and model.blocks[0].fc1.weight.is_meta
    x, expected = reference
    with torch.no_grad():
        assert torch.equal(model(x), expected)
