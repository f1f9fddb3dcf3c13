"""Checkpoints: ``training_state`` (``save_state`` / ``load_state`` of the whole training state,
atomically), its file names (``layout``, the peer's) and random states (``random_states``),
``weight_shards`` (a model's weights in shards of a maximum size) and ``saving`` (the peer's ``save``).

A strategy that shards its models brings its own checkpointer (``strategies/fsdp``,
``strategies/deepspeed``); this package holds what every strategy shares.
"""
