"""How one worker trains: one interface (``Strategy``), one registry, one implementation each.

``base``: the interface and ``StrategyContext``; ``registry``: the strategies in order and
``select`` (the choice, once per Accelerator, from its plugins and the environment);
``ddp`` (several processes or one), ``xla``, ``fsdp`` (FSDP2) and ``deepspeed``: the
implementations. Adding a strategy: a module here and one line in ``registry.STRATEGIES``.
"""

from notebook_accel.strategies.base import Strategy, StrategyContext
from notebook_accel.strategies.registry import (
           STRATEGIES,
           config_sections,
           select,
           strategy_class,
           worker_environment,
)

__all__ = ["STRATEGIES", "Strategy", "StrategyContext", "config_sections", "select", "strategy_class",
           "worker_environment"]
