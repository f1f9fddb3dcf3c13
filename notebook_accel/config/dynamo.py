"""The config file's ``dynamo_config`` section (the peer's format) and the workers' variables it gives.

Kernel side and torch-free. The section's ``dynamo_backend`` is the ``dynamo_backend`` launch
option's file layer (``LaunchConfig.dynamo_backend``); its other keys become the peer's
``ACCELERATE_DYNAMO_*`` variables, which ``TorchDynamoPlugin()`` reads in the workers::

    dynamo_config:
      dynamo_backend: INDUCTOR
      dynamo_mode: default
      dynamo_use_fullgraph: false
      dynamo_use_dynamic: false
      dynamo_use_regional_compilation: true
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from notebook_accel.contract import (
    DYNAMO_DYNAMIC_ENV,
    DYNAMO_FULLGRAPH_ENV,
    DYNAMO_MODE_ENV,
    DYNAMO_MODES,
    DYNAMO_REGIONAL_ENV,
    must_be,
    not_one_of,
)

SECTION = "dynamo_config"
BACKEND_KEY = "dynamo_backend"
# the section's other keys -> the workers' variable
SECTION_ENV = {
    "dynamo_mode": DYNAMO_MODE_ENV,
    "dynamo_use_fullgraph": DYNAMO_FULLGRAPH_ENV,
    "dynamo_use_dynamic": DYNAMO_DYNAMIC_ENV,
    "dynamo_use_regional_compilation": DYNAMO_REGIONAL_ENV,
}
KEYS = (BACKEND_KEY, *SECTION_ENV)


def check_section(section: Any) -> dict[str, Any]:
    """The section, its values checked (``dynamo_backend`` is checked as the launch option).

    Raises:
        ValueError: not a mapping, an unknown key, a bad mode or a non-boolean flag; the message
            names the key, the value and the valid ones.
    """
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ValueError(f"{SECTION} must be a mapping of {', '.join(KEYS)}, not {section!r}")
    out = dict(section)
    for key, value in section.items():
        if key not in KEYS:
            raise ValueError(f"{SECTION}: unknown key {key!r}; valid keys: {', '.join(KEYS)}")
        if value is None or key == BACKEND_KEY:
            continue
        if key == "dynamo_mode":
            if value not in DYNAMO_MODES:
                raise ValueError(f"{SECTION}: {not_one_of(key, value, DYNAMO_MODES)}")
        elif not isinstance(value, bool):
            raise ValueError(f"{SECTION}: {must_be(key, value, 'true or false')}")
    return out


def section_environment(section: Mapping[str, Any] | None) -> dict[str, str]:
    """The workers' ``ACCELERATE_DYNAMO_*`` variables for the section's keys other than the backend
    (which travels as the launch option); keys left out or null set nothing."""
    out = {}
    for key, value in (section or {}).items():
        if key in SECTION_ENV and value is not None:
            out[SECTION_ENV[key]] = str(value).lower() if isinstance(value, bool) else str(value)
    return out
