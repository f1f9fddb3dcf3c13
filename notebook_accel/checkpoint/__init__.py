"""Checkpoints: ``orchestration`` (an Accelerator's ``save_state`` / ``load_state``: hooks, counters,
automatic naming), ``training_state`` (the files of one checkpoint), ``model_files`` (the plain
checkpointer of models and optimizers), ``atomic_dir`` (written whole or
not at all), its file names (``layout``, the peer's), random states (``random_states``, through the
device kind), ``weight_files`` and ``weight_shards`` (a model's weights, in shards of a maximum size),
``project`` (``ProjectConfiguration``) and ``saving`` (the peer's ``save``).

Every strategy checkpoints its models and optimizers through its ``checkpointer``: the plain one here,
or its own where it shards them (``strategies/fsdp``, ``strategies/deepspeed``).
"""
