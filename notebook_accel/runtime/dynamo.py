"""``TorchDynamoPlugin`` and ``DynamoBackend``: how ``prepare`` compiles models (the peer's names).

Unset fields come from the peer's variables (``ACCELERATE_DYNAMO_BACKEND``, ``_MODE``,
``_USE_FULLGRAPH``, ``_USE_DYNAMIC``, ``_USE_REGIONAL_COMPILATION``), which the launcher sets
from the ``dynamo_backend`` option and the config file's ``dynamo_config``.

Example:
    >>> plugin = TorchDynamoPlugin(backend="inductor", use_regional_compilation=True)
    >>> accelerator = Accelerator(dynamo_plugin=plugin)  # doctest: +SKIP
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Any

from notebook_accel.contract import (
    DYNAMO_BACKEND_ENV,
    DYNAMO_BACKENDS,
    DYNAMO_DYNAMIC_ENV,
    DYNAMO_FULLGRAPH_ENV,
    DYNAMO_MODE_ENV,
    DYNAMO_MODES,
    DYNAMO_REGIONAL_ENV,
)
from notebook_accel.flags import str_to_bool
from notebook_accel.runtime.plugins import KwargsHandler

# The peer's enum (``DynamoBackend.INDUCTOR == "INDUCTOR"``), its values from the one vocabulary.
DynamoBackend = enum.Enum(  # type: ignore[misc]
    "DynamoBackend", [(name.upper(), name.upper()) for name in DYNAMO_BACKENDS], type=str,
    module=__name__)
DynamoBackend.__doc__ = "A torch.compile backend as the peer names it; ``NO``: do not compile."


def parse_backend(value: Any, source: str) -> Any:
    """``value`` (a ``DynamoBackend``, or its name in any case) as a ``DynamoBackend``.

    Raises:
        ValueError: naming ``source`` (where the value came from), the value and the valid names.
    """
    text = getattr(value, "value", value)
    if isinstance(text, str) and text.lower() in DYNAMO_BACKENDS:
        return DynamoBackend(text.upper())
    raise ValueError(f"{source}: dynamo backend {value!r} is not one of "
                     + ", ".join(repr(b) for b in DYNAMO_BACKENDS))


def _flag(value: Any, name: str, env: str) -> bool | None:
    """``value`` (a bool, or None: from ``env`` when it is set), or an error naming the place."""
    if value is None:
        raw = os.environ.get(env)
        if raw is None:
            return None
        try:
            return bool(str_to_bool(raw))
        except ValueError as err:
            raise ValueError(f"environment variable {env}: {err}") from None
    if not isinstance(value, bool):
        raise ValueError(f"TorchDynamoPlugin({name}={value!r}): must be True, False or None")
    return value


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """How ``prepare`` compiles models with ``torch.compile``.

    Args:
        backend: a ``DynamoBackend`` or its name, any case (default
            ``ACCELERATE_DYNAMO_BACKEND``, else ``"no"``: no compiling).
        mode: ``"default"``, ``"reduce-overhead"``, ``"max-autotune"`` or
            ``"max-autotune-no-cudagraphs"`` (default ``ACCELERATE_DYNAMO_MODE``, else ``"default"``).
        fullgraph: refuse graph breaks (default ``ACCELERATE_DYNAMO_USE_FULLGRAPH``, else False).
        dynamic: trace dynamic shapes (default ``ACCELERATE_DYNAMO_USE_DYNAMIC``, else torch's choice).
        options: a dict for the backend (``torch.compile``'s ``options``; it replaces ``mode``).
        disable: make ``torch.compile`` a no-op (for tests).
        use_regional_compilation: compile each block of the model's ``nn.ModuleList`` s of
            repeated blocks, and the rest separately, instead of the whole model: the compiler
            reuses the first block's work for the others, so cold starts are shorter
            (default ``ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION``, else False).

    Raises:
        ValueError: a bad backend, mode or flag, naming it, where it came from and the valid values.
    """

    backend: Any = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = parse_backend(os.environ.get(DYNAMO_BACKEND_ENV, "no"),
                                    f"environment variable {DYNAMO_BACKEND_ENV}")
        else:
            self.backend = parse_backend(self.backend, "TorchDynamoPlugin(backend=...)")
        source = "TorchDynamoPlugin(mode=...)"
        if self.mode is None:
            self.mode, source = os.environ.get(DYNAMO_MODE_ENV, "default"), f"environment variable {DYNAMO_MODE_ENV}"
        if self.mode not in DYNAMO_MODES:
            raise ValueError(f"{source}: dynamo mode {self.mode!r} is not one of "
                             + ", ".join(repr(m) for m in DYNAMO_MODES))
        self.fullgraph = bool(_flag(self.fullgraph, "fullgraph", DYNAMO_FULLGRAPH_ENV))
        self.dynamic = _flag(self.dynamic, "dynamic", DYNAMO_DYNAMIC_ENV)
        self.use_regional_compilation = bool(
            _flag(self.use_regional_compilation, "use_regional_compilation", DYNAMO_REGIONAL_ENV))

    @property
    def enabled(self) -> bool:
        """Whether ``prepare`` compiles (a backend other than ``NO``)."""
        return self.backend is not DynamoBackend.NO

    def to_dict(self) -> dict[str, Any]:
        """Every field; the backend as its lower-case name (as the peer)."""
        return {**super().to_dict(), "backend": self.backend.value.lower()}

    def to_kwargs(self) -> dict[str, Any]:
        """``torch.compile``'s keyword arguments: the fields that differ from their defaults without
        any variable set (as the peer), the backend by its lower-case name; never
        ``use_regional_compilation`` (it is how ``prepare`` compiles, not an argument)."""
        here = self.to_dict()
        return {k: here[k] for k, default in _DEFAULTS.items() if here[k] != default}


# the fields' values when neither the caller nor a variable sets them
_DEFAULTS = {"backend": "no", "mode": "default", "fullgraph": False, "dynamic": None, "options": None,
             "disable": False}
