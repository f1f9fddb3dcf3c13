"""DeepSpeed ZeRO through the Accelerator: the peer's ``DeepSpeedPlugin``, config keys and variables.

``plugin`` (settings, validated; no deepspeed import), ``config`` (a config file's
``deepspeed_config:`` as the workers' environment), ``runtime`` (helpers of the strategy:
the deepspeed import, ``"auto"`` values, the optimizer wrapper) and ``checkpointing``
(``save_state`` / ``load_state`` through DeepSpeed's own checkpoints). The Accelerator's
DeepSpeed behaviour (engine-backed ``prepare``, ``backward``, state dicts) is ``strategy``
(``DeepSpeedStrategy``). Only it, ``runtime`` and ``checkpointing`` import ``deepspeed``.
"""
