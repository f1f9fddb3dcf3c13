"""Version checks (the peer's ``accelerate.utils.versions``): ``is_torch_version(">=", "2.3")``."""

from __future__ import annotations

import importlib.metadata
import operator
import platform

import torch
from torch.torch_version import TorchVersion  # PEP 440 comparisons with plain strings

from notebook_accel._peer_paths import peer_logger

logger = peer_logger(__name__)

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


MIN_LINUX_KERNEL = "5.5.0"


def check_os_kernel() -> None:
    """Warn (logging) when this is Linux below ``MIN_LINUX_KERNEL``: processes can hang there."""
    info = platform.uname()
    if info.system != "Linux":
        return
    version = info.release.split("-")[0]
    if compare_versions(version, "<", MIN_LINUX_KERNEL):
        logger.warning(
            f"Detected kernel version {version}, which is below the recommended minimum of {MIN_LINUX_KERNEL}; "
            "this can cause the process to hang. Upgrade the kernel to the minimum version or higher."
        )
