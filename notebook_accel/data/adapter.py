"""The bases of our loaders, under the peer's names.

``DataLoaderAdapter``: a ``DataLoader`` that, built with ``use_stateful_dataloader=True``, is
its torchdata twin (``stateful.stateful_twin``). The peer's adapter wraps a loader it keeps as
``base_dataloader``; ours *are* their loaders, so an instance's ``base_dataloader`` is itself
(a ``StatefulDataLoader`` for a twin), and the class has none, as the peer's.

``DataLoaderStateMixin``: what ``GradientState`` reads of the loader being iterated
(``end_of_dataloader``; ``remainder`` is each loader's own), and ``begin`` / ``end``, which
register it with its ``gradient_state`` for the length of a pass.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader

__all__ = ["DataLoaderAdapter", "DataLoaderStateMixin"]


class _TheLoaderItself:
    """``base_dataloader``: the instance itself; an ``AttributeError`` on the class."""

    def __get__(self, loader: Any, owner: type | None = None) -> Any:
        if loader is None:
            raise AttributeError("base_dataloader is a loader's, not its class's")
        return loader


class DataLoaderAdapter(DataLoader):
    """A ``DataLoader`` that is a torchdata ``StatefulDataLoader`` when built with
    ``use_stateful_dataloader=True``; ``base_dataloader`` is the loader itself."""

    base_dataloader = _TheLoaderItself()

    def __new__(cls, *args: Any, use_stateful_dataloader: bool = False, **kwargs: Any) -> DataLoaderAdapter:
        if use_stateful_dataloader:
            from notebook_accel.data.stateful import stateful_twin

            cls = stateful_twin(cls)
        return super().__new__(cls)


class DataLoaderStateMixin:
    """The state a loader shows its ``gradient_state`` while it is iterated."""

    end_of_dataloader = False
    gradient_state: Any

    def reset(self) -> None:
        """Not at the end (a new pass)."""
        self.end_of_dataloader = False

    def begin(self) -> None:
        """A pass starts: the gradient state follows this loader."""
        self.reset()
        self.gradient_state.add_dataloader(self)

    def end(self) -> None:
        """The pass is over (or abandoned): the gradient state lets go of this loader."""
        self.gradient_state.remove_dataloader(self)
