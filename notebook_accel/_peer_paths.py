"""The peer's module paths (Hugging Face Accelerate's), importable under our name.

A user switching from Accelerate changes ``accelerate`` to ``notebook_accel`` in an import
and keeps it working: ``from notebook_accel.state import PartialState``, ``from
notebook_accel.data_loader import prepare_data_loader``, ``notebook_accel.fsdp.state_dict``...
Each such path is the module that owns the concept, under a second name: the same module
object (patching either name patches both; ``isinstance`` holds), and its classes keep their
real ``__module__``, so pickles name the real path. A package's submodules come with it.

``notebook_accel.accelerator`` and ``notebook_accel.utils`` are modules of their own (the
``Accelerator``; the ``accelerate.utils`` re-exports); every other module path is internal.
The peer's ``accelerate.checkpointing`` has no path here: its functions have other names
(``save_state`` / ``load_state`` are ``Accelerator`` methods).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

# the peer's path, under our name -> the module that owns it
PEER_PATHS: dict[str, str] = {
    "notebook_accel.state": "notebook_accel.runtime.state",
    "notebook_accel.optimizer": "notebook_accel.runtime.optim",
    "notebook_accel.scheduler": "notebook_accel.runtime.optim",
    "notebook_accel.test_utils": "notebook_accel.runtime.testing",
    "notebook_accel.data_loader": "notebook_accel.data.loader",
    "notebook_accel.logging": "notebook_accel.observe.logging",
    "notebook_accel.tracking": "notebook_accel.observe.tracking",
    "notebook_accel.big_modeling": "notebook_accel.big_model",
    "notebook_accel.fsdp": "notebook_accel.strategies.fsdp",
    "notebook_accel.local_sgd": "notebook_accel.strategies.local_sgd",
}


def real_name(name: str) -> str | None:
    """The module ``name`` stands for (``"notebook_accel.fsdp.plugin"`` ->
    ``"notebook_accel.strategies.fsdp.plugin"``), or ``None`` if it is no peer path."""
    for alias, real in PEER_PATHS.items():
        if name == alias or name.startswith(alias + "."):
            return real + name[len(alias):]
    return None


class _PeerPathFinder:
    """Imports a peer path as the module it stands for (that module, not a copy): a meta path
    finder and its loader (``importlib.abc``'s protocols, without importing that module)."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        return ModuleSpec(name, self) if real_name(name) else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(real_name(spec.name))
        spec.loader_state = module.__spec__  # the import system sets __spec__ to ours next
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state  # the real path again (reload, pickle)


def install() -> None:
    """Make the peer paths importable (once per interpreter; ``notebook_accel`` calls it)."""
    if not any(isinstance(finder, _PeerPathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PeerPathFinder())
