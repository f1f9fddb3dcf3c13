"""Where a run's snapshots go when ``snapshot_every`` / ``resume`` get no ``dir=``: the launch
option ``snapshot_dir`` (the workers get it in ``NOTEBOOK_ACCEL_SNAPSHOT_DIR``: from
``notebook_launcher(snapshot_dir=...)``, ``%%accelerate --snapshot-dir``, the environment or the
config file's ``snapshot_dir`` key), else ``snapshots.default_directory`` (``<project_dir>/snapshots``,
else ``./snapshots/<run>``).

A Colab user sets ``snapshot_dir: /content/drive/MyDrive/run7`` once in the config, and every
run's snapshots land on Drive, where a new session's ``resume()`` finds them; an fsspec URL
(``gs://bucket/run7``) is written through a local mirror (``snapshot_remote``).
"""

from __future__ import annotations

import os
from pathlib import Path

from notebook_accel import contract
from notebook_accel.checkpoint import snapshot_remote


def configured() -> str | None:
    """The launch option ``snapshot_dir`` as the workers got it (None: not set)."""
    return os.environ.get(contract.SNAPSHOT_DIR_ENV, "").strip() or None


def local_directory(where: str | os.PathLike[str], source: str = "dir") -> Path:
    """``where`` as an absolute local path (``~`` expanded; a ``file://`` URL is its path; another
    URL is its local mirror: ``snapshot_remote``).

    Raises:
        ValueError: a URL fsspec cannot open (an unknown scheme, or its package not installed),
            naming ``source``.
    """
    scheme = snapshot_remote.url_scheme(where)
    if scheme is None:
        return Path(where).expanduser().absolute()
    if scheme == "file":
        return Path(os.fspath(where)[len("file://"):] or "/").expanduser().absolute()
    return snapshot_remote.mirror(os.fspath(where), source)


def snapshot_directory(project_dir: str | os.PathLike[str] | None, chosen: str | os.PathLike[str] | None = None,
                       ) -> Path:
    """The directory of this run's snapshots: ``chosen`` (a ``dir=`` argument), else the launch
    option ``snapshot_dir``, else ``snapshots.default_directory(project_dir)``.

    Raises:
        ValueError: a URL fsspec cannot open (``local_directory``).
    """
    if chosen is not None:
        return local_directory(chosen)
    option = configured()
    if option is not None:
        return local_directory(option, f"snapshot_dir (environment variable {contract.SNAPSHOT_DIR_ENV})")
    from notebook_accel.checkpoint import snapshots  # (torch: not for the kernel's listing)

    return snapshots.default_directory(project_dir)
