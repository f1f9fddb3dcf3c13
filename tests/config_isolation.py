"""Config and cache dirs of a test's own: no test reads the developer's or another test's config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from torch.utils.cpp_extension import get_default_build_root

# DeepSpeed's compiled ops are cached here (recompiling costs minutes): pinned before any
# XDG_CACHE_HOME below moves the default.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", get_default_build_root())

# Where the code looks for config files (notebook_accel/config/files.py and the peer's).
CONFIG_DIRS = {"XDG_CONFIG_HOME": "config", "XDG_CACHE_HOME": "cache", "HF_HOME": "hf"}


def isolate_config(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Point the config and cache dirs into ``root`` (``root/cache``...) and unset every
    ``NOTEBOOK_ACCEL_*`` setting (the environment tier of the launch options)."""
    for name, folder in CONFIG_DIRS.items():
        monkeypatch.setenv(name, str(root / folder))
    for name in [n for n in os.environ if n.startswith("NOTEBOOK_ACCEL_")]:
        monkeypatch.delenv(name)
