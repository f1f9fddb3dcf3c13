"""``join_uneven_inputs(even_batches=...)``: the prepared loaders' ``even_batches``, switched for a block."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def even_batches_for(loaders: list[Any], even_batches: bool | None) -> Iterator[None]:
    """Within the block, the map-style ``loaders``' samplers use ``even_batches`` (when given); their own after.

    A loader over an ``IterableDataset`` keeps its setting, with a warning.
    """
    saved = [(dl.shard_sampler, dl.shard_sampler.even_batches) for dl in loaders if dl.shard_sampler]
    if even_batches is not None:
        for sampler, _ in saved:
            sampler.even_batches = even_batches
        if len(saved) < len(loaders):
            warnings.warn(
                "join_uneven_inputs(even_batches=...) is only supported for map-style datasets: "
                "loaders over an IterableDataset keep their setting", UserWarning, stacklevel=5,
            )
    try:
        yield
    finally:
        for sampler, value in saved:
            sampler.even_batches = value
