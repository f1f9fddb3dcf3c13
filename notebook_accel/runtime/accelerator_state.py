"""``AcceleratorState``: what ``accelerator.state`` is (the peer's name).

A ``PartialState`` plus the settings an ``Accelerator`` adds (mixed precision). As
with ``PartialState`` there is no shared singleton: each ``AcceleratorState`` is an
independent view of the environment; ``AcceleratorState()`` without arguments is the
latest Accelerator's (``runtime.latest``), and ``_reset_state`` forgets that one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from notebook_accel.runtime import precision
from notebook_accel.runtime.latest import LatestOrNew
from notebook_accel.runtime.state import PartialState


class AcceleratorState(PartialState, metaclass=LatestOrNew):
    """The distributed environment and an ``Accelerator``'s mixed precision.

    Args:
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``; default from the environment
            (see ``precision.resolve_mixed_precision``).
        cpu: force the CPU even when a GPU is present.
        timeout: collective timeout for the process group, if one is created here.
        backend, init_method: see ``PartialState``.

    Without arguments: the latest ``Accelerator``'s, if one lives (see ``runtime.latest``).
    """

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False,
                 timeout: timedelta | None = None, backend: str | None = None,
                 init_method: str | None = None) -> None:
        super().__init__(cpu=cpu, timeout=timeout, backend=backend, init_method=init_method)
        self.mixed_precision = precision.resolve_mixed_precision(mixed_precision)
        # the Accelerator's plugins (the peer's names; scripts test them, e.g. peft's FSDP examples)
        self.deepspeed_plugin: Any = None  # when it trains through DeepSpeed
        self.fsdp_plugin: Any = None  # when it trains through FSDP

    def __repr__(self) -> str:
        return super().__repr__()[:-1].replace("PartialState(", "AcceleratorState(", 1) + (
            f", mixed_precision={self.mixed_precision})"
        )

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """The peer's reset of its shared state: ``AcceleratorState()`` builds a new one again
        (existing states and Accelerators keep working: nothing is shared)."""
        LatestOrNew.forget(cls)
        if reset_partial_state:
            PartialState._reset_state()
