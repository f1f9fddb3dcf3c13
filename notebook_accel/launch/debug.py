"""``debug_launcher``: run a function on several CPU processes, to debug distributed code anywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from notebook_accel.launch.launcher import notebook_launcher


def debug_launcher(function: Callable[..., Any], args: tuple | list = (), num_processes: int = 2) -> Any:
    """``function(*args)`` on ``num_processes`` CPU workers (gloo), whatever accelerators exist.

    Returns:
        Rank 0's return value, as ``notebook_launcher`` does.

    Example:
        >>> debug_launcher(train, num_processes=2)  # doctest: +SKIP
    """
    return notebook_launcher(function, args, num_processes=num_processes, device="cpu")
