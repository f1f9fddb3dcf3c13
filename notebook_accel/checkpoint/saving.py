"""The peer's ``save``: one object to one file, written by one process (``accelerate.utils.save``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from notebook_accel.checkpoint.weight_shards import save_object
from notebook_accel.runtime.state import PartialState


def save(obj: Any, f: str | os.PathLike[str], save_on_each_node: bool = False,
         safe_serialization: bool = False) -> None:
    """Save ``obj`` to ``f`` on the main process (on each machine's with ``save_on_each_node``).

    Args:
        obj: anything ``torch.save`` takes; with ``safe_serialization``, a dict of tensors, written
            as safetensors (tensors sharing memory stored once, with a warning naming the others).
        f: the file.
        save_on_each_node: write on every machine's local main process (no shared file system).
        safe_serialization: safetensors instead of ``torch.save``.

    Tensors are copied to the CPU first where the device kind needs it (XLA's), so the file loads
    without that kind's runtime.
    """
    state = PartialState()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    obj = state.device_kind.to_cpu(obj)
    save_object(obj, Path(f), safe_serialization)
