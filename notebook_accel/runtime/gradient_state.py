"""Shared, per-Accelerator bookkeeping of gradient accumulation and the active data loaders.

One ``GradientState`` belongs to one ``Accelerator``; its optimizers, schedulers
and data loaders hold a reference to it. ``GradientState()`` without arguments is the
latest Accelerator's (``runtime.latest``: the peer's singleton, as far as users see it).
"""

from __future__ import annotations

from typing import Any

from notebook_accel.runtime.latest import LatestOrNew, SharedStateView


class GradientState(metaclass=LatestOrNew):
    """Whether this step syncs gradients, and where the innermost active loader stands.

    Args:
        num_steps: gradient accumulation steps.
        sync_with_dataloader: force a sync on the last batch of a loader.

    Without arguments: the latest ``Accelerator``'s, if one lives (see ``runtime.latest``).
    """

    _shared_state = SharedStateView()  # the peer's singleton dict, read-only (``runtime.latest``)

    def __init__(self, num_steps: int = 1, sync_with_dataloader: bool = True) -> None:
        if num_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {num_steps}")
        self.num_steps = num_steps
        self.sync_with_dataloader = sync_with_dataloader
        self.sync_gradients = True
        self.step = 0  # micro-steps since the last sync, counted by ``do_sync``
        self.active_dataloaders: list[Any] = []

    @classmethod
    def _reset_state(cls) -> None:
        """The peer's reset of its singleton: ``GradientState()`` builds a new one again."""
        LatestOrNew.forget(cls)

    @property
    def active_dataloader(self) -> Any:
        """The innermost loader being iterated, or ``None``."""
        return self.active_dataloaders[-1] if self.active_dataloaders else None

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared loader is being iterated."""
        return bool(self.active_dataloaders)

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the innermost active loader has just yielded its last batch."""
        loader = self.active_dataloader
        return bool(loader is not None and loader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        """Real samples in the innermost loader's last global batch (-1: no duplicates to drop)."""
        loader = self.active_dataloader
        return -1 if loader is None else loader.remainder

    def do_sync(self) -> None:
        """Advance one micro-step and decide whether it syncs (used by ``accumulate``)."""
        if self.sync_with_dataloader and self.end_of_dataloader:
            self.step = 0
            self.sync_gradients = True
        else:
            self.step += 1
            self.sync_gradients = self.step % self.num_steps == 0

    def add_dataloader(self, loader: Any) -> None:
        self.active_dataloaders.append(loader)

    def remove_dataloader(self, loader: Any) -> None:
        if loader in self.active_dataloaders:
            self.active_dataloaders.remove(loader)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sync_gradients": self.sync_gradients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.sync_gradients = bool(state["sync_gradients"])
