"""One process's random states in a checkpoint (``random_states_<rank>.pkl``), under the peer's keys.

``capture`` writes Python's, numpy's, torch's and the device kind's (CUDA's, XLA's) generator states and the
Accelerator's step in plain types, so that ``weights_only`` loading and the peer's
``load_state`` both read them; ``read`` also takes the peer's files (numpy arrays) and
``restore`` our earlier layout's.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import torch

from notebook_accel.runtime.device import TorchDevice


def capture(device_kind: TorchDevice, step: int | None = None) -> dict[str, Any]:
    """Every RNG state of this process under the peer's keys, in plain types: ``weights_only``
    loading accepts them, and so does the peer's ``load_state``. ``device_kind``: this process's
    (``runtime.device``), which adds its own generators'; ``step``: the Accelerator's, kept there too."""
    state: dict[str, Any] = {"random_state": random.getstate(), "torch_manual_seed": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy_random_seed"] = (kind, keys.tolist(), int(pos), int(has_gauss), float(cached))
    state.update(device_kind.rng_state())
    if step is not None:
        state["step"] = step
    return state


def restore(state: dict[str, Any], device_kind: TorchDevice) -> None:
    """Restore what ``capture`` returned (or the peer's file held, or our earlier layout's);
    ``device_kind`` restores its own generators'."""
    if "python" in state:  # our earlier layout
        version, internal, gauss = state["python"]
        kind, keys, pos, has_gauss, cached = state.get("numpy") or (None,) * 5
        state = {"random_state": (version, tuple(internal), gauss), "torch_manual_seed": state["torch"],
                 "numpy_random_seed": kind and (kind, keys.numpy().astype("uint32"), pos, has_gauss, cached),
                 "torch_cuda_manual_seed": state.get("cuda"), "xm_seed": state.get("xla")}
    version, internal, gauss = state["random_state"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch_manual_seed"])
    if state.get("numpy_random_seed"):
        import numpy as np

        np.random.set_state(tuple(state["numpy_random_seed"]))
    device_kind.set_rng_state(state)


def read(path: Path, weights_only: bool) -> Any:
    """A random-states file; the peer's holds numpy arrays, which ``weights_only`` loading takes
    once numpy's array types are allowed (torch >= 2.5)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError:
        allow = getattr(torch.serialization, "safe_globals", None)
        if not weights_only or allow is None:
            raise
        import numpy as np

        core = np._core if hasattr(np, "_core") else np.core  # numpy 2, numpy 1
        reconstruct = core.multiarray._reconstruct
        with allow([reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]):
            return torch.load(path, map_location="cpu", weights_only=weights_only)
