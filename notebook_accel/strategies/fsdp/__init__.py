"""Fully sharded data parallelism with torch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

``plugin``: the peer's ``FullyShardedDataParallelPlugin`` (fields, environment, validation);
``sharding``: ``fully_shard`` as the plugin says; ``state_dict``: full weights and plain
modules out of sharded ones, merging checkpoints; ``checkpointing``: ``save_state`` /
``load_state`` of sharded models and optimizers; ``strategy``: ``FsdpStrategy``, the
Accelerator's FSDP behaviour. Users also reach this package as ``notebook_accel.fsdp``.
Only ``plugin`` is light; the others import ``torch.distributed.fsdp`` and are imported
when an Accelerator actually shards.
"""
