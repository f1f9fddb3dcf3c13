"""How one worker trains: one interface (``Strategy``), one registry, one implementation each.

``base``: the interface and ``StrategyContext``; ``registry``: the strategies in order and
``select`` (the choice, once per Accelerator, from its plugins and the environment);
the implementations: ``ddp`` (several processes or one) and ``xla`` (on the XLA device kind,
``runtime.xla``), and the folders ``fsdp/`` (FSDP2) and
``deepspeed/``, each holding its strategy (``strategy.py``) with its mechanics (plugin,
config-file section, checkpointer...); ``preparation``: what ``prepare`` does with one call's
objects. Adding a strategy: a module, or a folder for one
with mechanics of its own, and one line in ``registry.STRATEGIES``.

This package imports nothing: the kernel reads ``registry`` without importing torch.
"""

