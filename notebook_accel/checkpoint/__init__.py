"""Checkpoints: ``training_state`` (``save_state`` / ``load_state`` of the whole training state,
atomically) and ``weight_shards`` (a model's weights in shards of a maximum size).

A strategy that shards its models brings its own checkpointer (``strategies/fsdp``,
``strategies/deepspeed``); this package holds what every strategy shares.
"""
