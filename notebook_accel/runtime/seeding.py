"""Seeding every random number generator a training loop touches."""

from __future__ import annotations

import os
import random

import torch

from notebook_accel.runtime.state import PartialState


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy (if installed), torch and CUDA (if present).

    Args:
        seed: the seed.
        device_specific: add the process's global rank to ``seed``, so each process
            draws different numbers (the data loader's shuffling stays identical).
        deterministic: also ask torch for deterministic algorithms.

    Example:
        >>> set_seed(42)
    """
    if device_specific:
        seed += PartialState().process_index
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is optional
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device, lazily
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
