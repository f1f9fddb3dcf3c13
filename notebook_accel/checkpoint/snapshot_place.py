"""Where a run's snapshots go when ``snapshot_every`` / ``resume`` get no ``dir=``: the launch
option ``snapshot_dir`` (the workers get it in ``NOTEBOOK_ACCEL_SNAPSHOT_DIR``: from
``notebook_launcher(snapshot_dir=...)``, ``%%accelerate --snapshot-dir``, the environment or the
config file's ``snapshot_dir`` key), else ``snapshots.default_directory`` (``<project_dir>/snapshots``,
else ``./snapshots/<run>``).

A Colab user sets ``snapshot_dir: /content/drive/MyDrive/run7`` once in the config, and every
run's snapshots land on Drive, where a new session's ``resume()`` finds them.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from notebook_accel import contract


def configured() -> str | None:
    """The launch option ``snapshot_dir`` as the workers got it (None: not set)."""
    return os.environ.get(contract.SNAPSHOT_DIR_ENV, "").strip() or None


_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)")


def local_directory(where: str | os.PathLike[str], source: str = "dir") -> Path:
    """``where`` as an absolute local path (``~`` expanded; a ``file://`` URL is its path).

    Raises:
        ValueError: another URL (``gs://``, ``s3://``, ``memory://``...), naming ``source``: without
            fsspec, with the command that installs it; with it, as not built yet (a mounted folder,
            such as Colab's Drive, is a local path).
    """
    match = _URL.fullmatch(os.fspath(where))
    if match is None:
        return Path(where).expanduser().absolute()
    scheme, rest = match.groups()
    if scheme == "file":
        return Path(rest or "/").expanduser().absolute()
    if importlib.util.find_spec("fsspec") is None:
        raise ValueError(f"{source}={os.fspath(where)!r}: a {scheme}:// URL needs fsspec "
                         f"(pip install fsspec, and the package of {scheme}://), which is not installed")
    raise ValueError(f"{source}={os.fspath(where)!r}: snapshots to fsspec URLs ({scheme}://) are not "
                     "built yet; give a folder every rank sees (a mounted Drive or bucket is one) or a "
                     "file:// URL")


def snapshot_directory(project_dir: str | os.PathLike[str] | None, chosen: str | os.PathLike[str] | None = None,
                       ) -> Path:
    """The directory of this run's snapshots: ``chosen`` (a ``dir=`` argument), else the launch
    option ``snapshot_dir``, else ``snapshots.default_directory(project_dir)``.

    Raises:
        ValueError: a URL other than ``file://`` (``local_directory``).
    """
    if chosen is not None:
        return local_directory(chosen)
    option = configured()
    if option is not None:
        return local_directory(option, f"snapshot_dir (environment variable {contract.SNAPSHOT_DIR_ENV})")
    from notebook_accel.checkpoint import snapshots  # (torch: not for the kernel's listing)

    return snapshots.default_directory(project_dir)
