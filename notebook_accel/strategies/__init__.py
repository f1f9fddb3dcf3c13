"""How one worker trains: one interface (``Strategy``), one registry, one implementation each.

``base``: the interface and ``StrategyContext``; ``registry``: the strategies in order and
``select`` (the choice, once per Accelerator, from its plugins and the environment);
the implementations: ``ddp`` (several processes or one) and ``xla`` (its device layer is
``runtime.xla``, which the runtime uses too), and the folders ``fsdp/`` (FSDP2) and
``deepspeed/``, each holding its strategy (``strategy.py``) with its mechanics (plugin,
config-file section, checkpointer...). Adding a strategy: a module, or a folder for one
with mechanics of its own, and one line in ``registry.STRATEGIES``.

This package imports nothing: the kernel reads ``registry`` without importing torch.
"""

