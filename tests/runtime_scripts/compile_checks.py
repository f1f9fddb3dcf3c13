"""torch.compile through the Accelerator, in one launch of 2 workers (gloo, CPU).

``run(out)`` is the workers' function (``tests/runtime/test_compile.py`` launches it with a
config file whose ``dynamo_config`` says inductor): DDP compiled by the launch's settings vs
eager, checkpoints of the compiled model, regional compilation, FSDP2 and DeepSpeed compiled. It returns
plain data for the test to check.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

STEPS = 10


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) + x


class Net(torch.nn.Module):
    """Repeated blocks (for regional compilation) and a head."""

    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's batches: random inputs, a learnable target."""
    gen = torch.Generator().manual_seed(1234)
    data = [torch.randn(2, 8, 16, generator=gen) for _ in range(STEPS)]
    return [(x[rank], 0.3 * x[rank].sum(-1, keepdim=True).sin()) for x in data]


def _train(accelerator, steps: int = STEPS) -> tuple[torch.nn.Module, list[float]]:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for x, y in _batches(accelerator.process_index)[:steps]:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    return model, losses


def _max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def _checkpoints(accelerator, model: torch.nn.Module, out: Path) -> dict:
    from safetensors.torch import load_file

    state = accelerator.get_state_dict(model)
    accelerator.save_model(model, out / "model")
    accelerator.save_state(out / "state")
    accelerator.wait_for_everyone()
    plain = Net()  # uncompiled: the files load into it, strictly
    plain.load_state_dict(load_file(out / "model" / "model.safetensors"))
    from_save_model = _same(plain.state_dict(), state)
    plain.load_state_dict(load_file(out / "state" / "model.safetensors"))
    from_save_state = _same(plain.state_dict(), state)
    with torch.no_grad():  # load_state into the compiled model restores it
        for param in model.parameters():
            param.zero_()
    accelerator.load_state(out / "state")
    restored = _same(accelerator.get_state_dict(model), state)
    return {
        "keys_with_orig_mod": [k for k in state if "_orig_mod" in k],
        "from_save_model": from_save_model, "from_save_state": from_save_state,
        "load_state_restores": restored,
        "kept": type(accelerator.unwrap_model(model)).__name__,
        "plain": type(accelerator.unwrap_model(model, keep_torch_compile=False)).__name__,
    }


def _regional(eager_losses: list[float]) -> dict:
    import torch._dynamo

    from notebook_accel import Accelerator, TorchDynamoPlugin

    torch._dynamo.utils.counters.clear()
    accelerator = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    model, losses = _train(accelerator, steps=3)
    kept = accelerator.unwrap_model(model)
    return {
        "blocks": [type(block).__name__ for block in kept.blocks],
        "block_modules": [type(block._orig_mod).__name__ for block in kept.blocks],
        "whole_compiled": type(model).__name__ == "OptimizedModule",
        "frames_compiled": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "loss_diff": _max_diff(losses, eager_losses[:3]),
        "keys_with_orig_mod": [k for k in accelerator.get_state_dict(model) if "_orig_mod" in k],
    }


def _fsdp(eager_losses: list[float], regional: bool = False) -> dict:
    from notebook_accel import Accelerator, FullyShardedDataParallelPlugin, TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=regional)
    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(), dynamo_plugin=plugin)
    model, losses = _train(accelerator)
    state = accelerator.get_state_dict(model)
    compiled = [model.blocks[0], model.blocks[1], model.head] if regional else [model]
    return {
        "distributed_type": str(accelerator.distributed_type.value),
        "compiled_in_place": all(getattr(m, "_compiled_call_impl", None) is not None for m in compiled),
        "whole_compiled": getattr(model, "_compiled_call_impl", None) is not None,
        "sharded": accelerator.strategy.owns(model),
        "loss_diff": _max_diff(losses, eager_losses),
        "keys_with_orig_mod": [k for k in state if "_orig_mod" in k],
    }


def _deepspeed() -> dict | None:
    """ZeRO-2 with its engine's module compiled in place (None where deepspeed is not installed)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return None
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import Accelerator, DeepSpeedPlugin

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2), dynamo_backend="eager")
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(64, 16)
    loader = DataLoader(TensorDataset(x, 0.3 * x.sum(-1, keepdim=True).sin()), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    losses = []
    for _ in range(2):
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
    return {
        "engine": type(model).__name__,
        "compiled_in_place": getattr(model.module, "_compiled_call_impl", None) is not None,
        "first_epoch": sum(losses[:4]), "second_epoch": sum(losses[4:]),
        "keys_with_orig_mod": [k for k in accelerator.get_state_dict(model) if "_orig_mod" in k],
    }


def run(out: str) -> dict:
    """The workers' function: every check, as plain data."""
    from notebook_accel import Accelerator

    accelerator = Accelerator()  # compiles as the launch said (ACCELERATE_DYNAMO_*)
    plugin = accelerator.state.dynamo_plugin
    result = {
        "env": {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_DYNAMO_")},
        "plugin": [plugin.backend.value, plugin.mode, plugin.fullgraph, plugin.dynamic,
                   plugin.use_regional_compilation],
    }
    compiled, compiled_losses = _train(accelerator)
    _, eager_losses = _train(Accelerator(dynamo_backend="no"))
    result["prepared_type"] = type(compiled).__name__
    result["wrapped_type"] = type(compiled._orig_mod).__name__
    result["loss_diff"] = _max_diff(compiled_losses, eager_losses)
    result["losses"] = compiled_losses
    result["checkpoints"] = _checkpoints(accelerator, compiled, Path(out))
    result["regional"] = _regional(eager_losses)
    result["fsdp"] = _fsdp(eager_losses)
    result["fsdp_regional"] = _fsdp(eager_losses, regional=True)
    result["deepspeed"] = _deepspeed()
    return result
