"""Data loaders sharded across processes, with checkpointable shuffling and position.

``prepare``: what ``Accelerator.prepare`` does to a loader (``shard_data_loader``,
``DataLoaderConfiguration``, ``skip_first_batches``); ``loader``: the peer's
``accelerate.data_loader`` names (``prepare_data_loader``...); the loaders: ``shard``
(``DataLoaderShard``), ``dispatch`` (rank 0 loads), ``skip``; which batches a rank takes:
``sharding`` (map-style), ``iterable`` (streams), ``samplers``; ``uneven``: ``join_uneven_inputs``'
``even_batches`` switch.
"""
