"""torchdata's ``StatefulDataLoader`` under our loaders (``use_stateful_dataloader=True``, as in the peer).

``DataLoaderShard``, ``DataLoaderDispatcher`` and ``SkipDataLoader`` built with
``use_stateful_dataloader=True`` (and every loader ``prepare`` makes under
``DataLoaderConfiguration(use_stateful_dataloader=True)``) are instances of their twin here: a
subclass of ours and of torchdata's ``StatefulDataLoader`` (``StatefulDataLoaderShard``...), so ``isinstance(dl, StatefulDataLoader)``
holds and ``state_dict`` / ``load_state_dict`` are torchdata's: after ``load_state_dict`` the next
pass resumes where the state was taken.

Our shard and dispatcher draw one batch ahead (to know the last one), so their state is the one
taken before each draw: it counts the batches the user has been given, as the peer's does. A
loader that shuffles with a sampler torchdata cannot checkpoint (``prepare``'s: torch's
``RandomSampler`` on our generator) adds its epoch progress (``shard.LoaderProgress``: the
generator at the epoch's start, the sampler's epoch, the batches done) under ``PROGRESS_KEY``,
which torchdata and the peer ignore, so a resumed epoch replays the same order.

Needs torchdata (``pip install notebook-accel[stateful]``); without it building a twin raises
``ImportError``, as the peer does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import RandomSampler

from notebook_accel.data.torchdata_state import PROGRESS_KEY, batches_done

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.stateful import Stateful
except ImportError as error:  # torchdata is an optional dependency (the stateful extra)
    raise ImportError(
        "use_stateful_dataloader=True needs torchdata >= 0.11 (its StatefulDataLoader): "
        "pip install 'notebook-accel[stateful]'"
    ) from error

__all__ = ["PROGRESS_KEY", "stateful_twin"]


class _DrawAheadState:
    """torchdata's state of a loader that draws one batch ahead: taken before each draw."""

    _taken: dict[str, Any] | None = None

    def _batches(self) -> Iterator[Any]:
        batches = super()._batches()
        self._taken = None
        while True:
            if self._iterator is not None:  # (a dispatcher's rank > 0 never draws: no state to take)
                self._taken = StatefulDataLoader.state_dict(self)
            try:
                batch = next(batches)
            except StopIteration:
                self._taken = StatefulDataLoader.state_dict(self)
                return
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """torchdata's state as of the last batch given out (plus ``PROGRESS_KEY``, see the module)."""
        state = dict(self._taken) if self._taken is not None else StatefulDataLoader.state_dict(self)
        if _shuffles_untracked(self):
            state[PROGRESS_KEY] = self.progress.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` on the next pass (``resume_step``: the batches it had done)."""
        state = dict(state)
        progress = state.pop(PROGRESS_KEY, None)
        if progress is not None:
            self.progress.load_state_dict(progress)
        self.progress.resume_step = batches_done(state)
        StatefulDataLoader.load_state_dict(self, state)
        self._taken = state  # the state until the next pass (torchdata would replay it to answer)


def _shuffles_untracked(loader: Any) -> bool:
    """``loader`` shuffles with a sampler that torchdata's state does not hold."""
    shard = loader.shard_sampler
    sampler = getattr(shard.batch_sampler if shard is not None else loader.batch_sampler, "sampler", None)
    return isinstance(sampler, RandomSampler) and not isinstance(sampler, Stateful)


def stateful_twin(cls: type) -> type:
    """``cls`` with torchdata's ``StatefulDataLoader`` among its bases (``cls`` itself if it has it).

    Made once per class, and kept in this module under its name (``StatefulDataLoaderShard``...)
    so that pickle finds it. Our shard and dispatcher (which draw one batch ahead) take their state
    before each draw; others (``SkipDataLoader``) give torchdata's state as it is.
    """
    if issubclass(cls, StatefulDataLoader):
        return cls
    if cls not in _TWINS:
        name = f"Stateful{cls.__name__}"
        mixins = (_DrawAheadState,) if hasattr(cls, "_batches") else ()  # DataLoaderShard's draw ahead
        twin = type(name, (*mixins, cls, StatefulDataLoader),
                    {"__module__": __name__, "__qualname__": name, "__doc__": f"``{cls.__name__}`` on torchdata."})
        _TWINS[cls] = globals()[name] = twin
    return _TWINS[cls]


_TWINS: dict[type, type] = {}
