"""Models and checkpoints for the big-model tests and benchmark (written with the safetensors
library itself, in the Hub's sharded layout)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn


class Block(nn.Module):
    """A residual MLP block: splitting it across devices would be wrong-footed, so it is no-split."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Net(nn.Module):
    """``blocks`` blocks of ``8 * width**2`` weights each, between an input and an output layer."""

    def __init__(self, width: int = 64, blocks: int = 24) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.out = nn.Linear(width, width)
        self.register_buffer("scale", torch.full((width,), 0.5))  # persistent buffer, on the root

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x) * self.scale


class TiedLM(nn.Module):
    """Embedding and output head sharing one weight (tied), with blocks between."""

    def __init__(self, vocab: int = 300, width: int = 32, blocks: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def random_state(model: nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for every tensor of ``model`` (meta is fine), tied weights once."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    seen = set()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        state[name] = (torch.randn(tensor.shape, generator=g) * 0.02).to(tensor.dtype)
    return state


def write_sharded(state: dict[str, torch.Tensor], folder: str | os.PathLike, shards: int) -> Path:
    """``model-0000i-of-0000n.safetensors`` files plus ``model.safetensors.index.json``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = list(state)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        part = names[i * per:(i + 1) * per]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: state[n].contiguous() for n in part}, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def eager(model_class, state: dict[str, torch.Tensor], **kwargs) -> nn.Module:
    """The model loaded the ordinary way, for reference outputs."""
    model = model_class(**kwargs)
    model.load_state_dict(state, strict=False)
    return model.eval()


class FakeGPUs:
    """The device seam with ``count`` pretend GPUs of ``free`` bytes each, whose tensors really
    live on the CPU; records every GPU a tensor or an input was placed on."""

    def __init__(self, count: int, free: int = 1 << 30) -> None:
        self.count, self.free = count, free
        self.placed: set[int] = set()

    def gpu_count(self) -> int:
        return self.count

    def gpu_free_memory(self, index: int) -> int:
        return self.free

    def torch_device(self, key) -> torch.device:
        if isinstance(key, int):
            self.placed.add(key)
            return torch.device("cpu")
        return torch.device(key)


def plan_bytes(model: nn.Module, plan: dict) -> dict:
    """Bytes of weights each device holds under ``plan`` (each tensor once)."""
    from notebook_accel.big_model.model_tensors import all_tensors, owning_entry

    held: dict = {}
    seen = set()
    for name, tensor in all_tensors(model).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        device = plan[owning_entry(name, plan)]
        held[device] = held.get(device, 0) + tensor.numel() * tensor.element_size()
    return held


def probe(kind: str, checkpoint: Path, width: int, blocks: int, budget: int, out_dir: Path) -> dict:
    """Run ``tests.big_model_probe`` in a fresh process and return its figures."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.big_model_probe", kind, str(checkpoint), str(width), str(blocks),
         str(budget), str(out_dir)],
        capture_output=True, text=True, env=env, cwd=root, timeout=600,
    )
    if done.returncode:
        raise RuntimeError(f"probe {kind} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_net_checkpoint(folder: Path, width: int, blocks: int, shards: int = 6) -> Path:
    """A random ``Net(width, blocks)`` checkpoint in ``folder``, built without the model in memory."""
    from notebook_accel import init_empty_weights

    with init_empty_weights():
        model = Net(width, blocks)
    names = [name for name, _ in [*model.named_parameters(), *model.named_buffers()]]
    per = -(-len(names) // shards)
    weight_map = {}
    g = torch.Generator().manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = dict([*model.named_parameters(), *model.named_buffers()])
    for i in range(shards):  # one shard in memory at a time
        part = names[i * per:(i + 1) * per]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: torch.randn(tensors[n].shape, generator=g) * 0.02 for n in part}, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder
