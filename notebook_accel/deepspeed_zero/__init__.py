"""DeepSpeed ZeRO through the Accelerator: the peer's ``DeepSpeedPlugin``, config keys and variables.

``plugin`` (settings, validated; no deepspeed import), ``config`` (a config file's
``deepspeed_config:`` as the workers' environment), ``runtime`` (engine-backed ``prepare``,
``backward``, state dicts) and ``checkpointing`` (``save_state`` / ``load_state`` through
DeepSpeed's own checkpoints). Only ``runtime`` and ``checkpointing`` import ``deepspeed``.
"""
