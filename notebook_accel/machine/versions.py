"""Version checks (the peer's ``accelerate.utils.versions``): ``is_torch_version(">=", "2.3")``."""

from __future__ import annotations

import importlib.metadata
import operator

import torch
from torch.torch_version import TorchVersion  # PEP 440 comparisons with plain strings

OPERATIONS = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
              "<=": operator.le, "<": operator.lt}


def compare_versions(library_or_version: str, operation: str, requirement_version: str) -> bool:
    """``library_or_version`` (an installed package's name, or a version) ``operation`` ``requirement_version``.

    Raises ``ValueError`` for an unknown operation, naming the valid ones, and
    ``importlib.metadata.PackageNotFoundError`` for a package that is not installed.
    """
    if operation not in OPERATIONS:
        raise ValueError(f"operation must be one of {list(OPERATIONS)}, got {operation!r}")
    version = str(library_or_version)
    if not version[:1].isdigit():
        version = importlib.metadata.version(version)
    return OPERATIONS[operation](TorchVersion(version), requirement_version)


def is_torch_version(operation: str, version: str) -> bool:
    """The running torch's version ``operation`` ``version``, e.g. ``is_torch_version(">=", "2.3")``."""
    return compare_versions(torch.__version__, operation, version)
