"""The strategy seam: one interface, a registry chosen once, one implementation per strategy."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import pytest
import torch

from notebook_accel import Accelerator
from notebook_accel.runtime.state import DistributedType, collective_backend
from notebook_accel.strategies import registry
from notebook_accel.strategies.base import Strategy
from notebook_accel.strategies.ddp import DdpStrategy
from notebook_accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin
from notebook_accel.strategies.registry import STRATEGIES, strategy_class


def test_the_default_is_ddp_and_one_process_is_its_plain_case():
    accelerator = Accelerator(cpu=True)
    assert isinstance(accelerator.strategy, DdpStrategy)
    assert accelerator.distributed_type is DistributedType.NO
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    assert type(model) is torch.nn.Linear  # one process: no DDP wrapper


def test_an_fsdp_plugin_chooses_fsdp_which_alone_shards_nothing_but_keeps_its_checkpoint_layout():
    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    assert accelerator.strategy.name == "fsdp" and accelerator.fsdp_plugin is accelerator.strategy.plugin
    assert accelerator.distributed_type is DistributedType.NO and accelerator.deepspeed_plugin is None
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    assert type(model) is torch.nn.Linear
    from notebook_accel.checkpoint.orchestration import checkpoint_items
    from notebook_accel.strategies.fsdp.checkpointing import FsdpCheckpointer

    assert isinstance(checkpoint_items(accelerator).checkpointer, FsdpCheckpointer)


def test_plugins_for_two_strategies_are_refused(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError, match="deepspeed and fsdp.*choose one strategy"):
        Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_strategy_implements_the_one_interface_with_its_signatures(name):
    cls = strategy_class(name)
    assert issubclass(cls, Strategy) and cls.name == name and not inspect.isabstract(cls)
    for method in ("setup_model", "setup_optimizer", "setup_model_and_optimizer", "backward", "no_sync",
                   "clip_grad_norm_", "clip_grad_value_", "unwrap", "model_state_dict", "checkpointer",
                   "trigger_sync_in_backward", "join_uneven_inputs", "to_cpu", "release"):
        assert _parameters(getattr(cls, method)) == _parameters(getattr(Strategy, method)), method


def _parameters(function: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_collective_backend_is_chosen_in_one_place():
    assert [collective_backend(d) for d in ("cuda", "cpu", "xla", "mps")] == ["nccl", "gloo", "xla", "gloo"]


class _CountingStrategy(DdpStrategy):
    """A strategy added by a module and one registry line."""

    name: ClassVar[str] = "counting"
    backwards = 0

    @classmethod
    def wanted(cls, context: Any, plugin: Any) -> bool:
        return True

    def backward(self, loss: torch.Tensor, scaler: Any, **kwargs: Any) -> None:
        type(self).backwards += 1
        super().backward(loss, scaler, **kwargs)


def test_adding_a_strategy_is_one_registry_line(monkeypatch):
    counting = registry.Registration(f"{__name__}:_CountingStrategy", ())
    monkeypatch.setattr(registry, "STRATEGIES", {"counting": counting, **STRATEGIES})
    accelerator = Accelerator(cpu=True)
    assert isinstance(accelerator.strategy, _CountingStrategy)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(3, 2)).sum())
    optimizer.step()
    assert _CountingStrategy.backwards == 1
    assert accelerator.clip_grad_norm_(model.parameters(), 1.0) is not None


def test_on_xla_fsdp_alone_runs_as_xla_and_sharding_or_deepspeed_are_refused():
    from notebook_accel.strategies.base import StrategyContext
    from notebook_accel.strategies.deepspeed.plugin import DeepSpeedPlugin

    plugin = FullyShardedDataParallelPlugin()
    alone = StrategyContext.on_device(torch.device("xla", 0))
    strategy, plugins = registry.select(alone, {"fsdp": plugin})
    assert strategy.name == "xla" and plugins["fsdp"] is plugin
    several = StrategyContext.on_device(torch.device("xla", 0), num_processes=2)
    with pytest.raises(ValueError, match="does not run on XLA devices.*'cuda' or 'cpu'"):
        registry.select(several, {"fsdp": plugin})
    with pytest.raises(ValueError, match="DeepSpeed does not run on XLA"):
        registry.select(alone, {"deepspeed": DeepSpeedPlugin()})
