"""Truth values written as strings (environment variables, config values): one table for the engine.

``str_to_bool`` is the peer's name (``accelerate.utils.str_to_bool``, re-exported by
``notebook_accel.utils``); ``env_flag`` reads a variable with it, leniently; ``to_bool`` reads a
setting (a bool, or a string from a config file or variable), strictly, naming it when it is bad.
"""

from __future__ import annotations

import os
from typing import Any

TRUE_STRINGS = ("y", "yes", "t", "true", "on", "1")
FALSE_STRINGS = ("n", "no", "f", "false", "off", "0")


def str_to_bool(value: str) -> int:
    """1 for a true-ish string (``yes``, ``true``, ``on``, ``1``...), 0 for a false-ish one.

    Raises:
        ValueError: anything else, naming the accepted values.
    """
    text = str(value).strip().lower()
    if text in TRUE_STRINGS:
        return 1
    if text in FALSE_STRINGS:
        return 0
    raise ValueError(f"invalid truth value {value!r}; use one of {TRUE_STRINGS + FALSE_STRINGS}")


def env_flag(*names: str, default: bool = False) -> bool:
    """Whether the first of ``names`` that is set holds a true-ish value (anything else is false).

    Example:
        >>> env_flag("NOTEBOOK_ACCEL_DEBUG_MODE", "ACCELERATE_DEBUG_MODE")
        False
    """
    for name in names:
        raw = os.environ.get(name)
        if raw is not None:
            return raw.strip().lower() in TRUE_STRINGS
    return default


def to_bool(name: str, value: Any) -> bool:
    """``value`` (a bool, or a string such as ``"true"``; an empty string is false) as a bool.

    Raises:
        ValueError: anything else, naming the setting ``name`` and the valid values.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE_STRINGS + FALSE_STRINGS + ("",):
        return value.strip().lower() in TRUE_STRINGS
    raise ValueError(f"invalid value {value!r} for {name}; valid values: true, false")
