"""Snapshots kept at an fsspec URL (``gs://``, ``s3://``, ``hf://``: any file system fsspec knows).

They are written as any snapshot, atomically, into a local mirror folder every rank of the machine
shares (``<cache>/notebook_accel/snapshot_mirrors/<scheme>-<hash>``; ``<cache>``: ``$XDG_CACHE_HOME``,
else ``~/.cache``), which remembers its URL (a ``.remote`` file). Rank 0's background thread then
uploads each complete snapshot, ``snapshot.json`` last: a store without renames has no ``.tmp``
folders, so there a snapshot without ``snapshot.json`` is the incomplete one, never loaded; then
it prunes the old ones there too. ``resume`` first downloads the newest complete one into the
mirror when the mirror lacks it (a new machine, an emptied cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from notebook_accel.checkpoint import snapshot_dir
from notebook_accel.checkpoint.atomic_dir import swap_in

REMOTE_FILE = ".remote"
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)")
_NAME = re.compile(r"snapshot_(\d+)")


def url_scheme(where: str | os.PathLike[str]) -> str | None:
    """The scheme of ``where`` when it is a URL (``gs``, ``file``...), else ``None``."""
    match = _URL.fullmatch(os.fspath(where))
    return match.group(1) if match else None


def check(url: str, source: str) -> None:
    """Refuse (``ValueError``, naming ``source``) a URL fsspec cannot open: an unknown scheme, or
    one whose package is not installed."""
    import fsspec

    try:
        fsspec.get_filesystem_class(url_scheme(url))
    except (ImportError, ValueError) as error:
        raise ValueError(f"{source}={url!r}: fsspec cannot open it ({error})") from None


def mirror(url: str, source: str) -> Path:
    """The local mirror folder of ``url`` (created, remembering its URL).

    Raises:
        ValueError: fsspec cannot open ``url`` (``check``).
    """
    check(url, source)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    folder = cache / "notebook_accel" / "snapshot_mirrors" / (
        f"{url_scheme(url)}-{hashlib.sha256(url.rstrip('/').encode()).hexdigest()[:16]}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / REMOTE_FILE).write_text(url.rstrip("/"))
    return folder.absolute()


def remote_of(directory: Path) -> str | None:
    """The URL a mirror folder stands for (``None``: a plain local folder)."""
    try:
        return (directory / REMOTE_FILE).read_text().strip() or None
    except OSError:
        return None


def push(snapshot: Path, url: str, keep: int) -> None:
    """Upload the complete local ``snapshot`` folder to ``url`` (``snapshot.json`` last), then
    remove there the complete snapshots older than the newest ``keep`` and any incomplete one
    (only this run's rank 0 uploads: an incomplete one is a killed upload's)."""
    fs, root = _open(url)
    target = f"{root}/{snapshot.name}"
    files = sorted(p for p in snapshot.rglob("*") if p.is_file())
    for path in [p for p in files if p.name != snapshot_dir.META] + [snapshot / snapshot_dir.META]:
        remote = f"{target}/{path.relative_to(snapshot).as_posix()}"
        fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(path), remote)
    found = _remote_listing(fs, root)
    complete = [info for info in found if info.complete]
    doomed = complete[: max(len(complete) - keep, 0)] + [i for i in found if not i.complete]
    for info in doomed:
        fs.rm(f"{root}/{info.path.name}", recursive=True)


def pull_newest(directory: Path) -> None:
    """Where ``directory`` mirrors a URL: download the newest complete snapshot there into it,
    unless the mirror has it (every rank of the machine then sees it)."""
    url = remote_of(directory)
    if url is None:
        return
    fs, root = _open(url)
    complete = [info for info in _remote_listing(fs, root) if info.complete]
    if not complete or (directory / complete[-1].path.name / snapshot_dir.META).is_file():
        return
    name = complete[-1].path.name
    tmp = directory / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for remote in fs.find(f"{root}/{name}"):
        local = tmp / remote[len(root) + len(name) + 2:]
        local.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(remote, str(local))
    swap_in(tmp, directory / name)


def listing(url: str) -> list[snapshot_dir.SnapshotInfo]:
    """The snapshots at ``url``, as ``snapshot_dir.listing`` orders them (their ``path``: the
    mirror's name for each; their size: the store's)."""
    fs, root = _open(url)
    return _remote_listing(fs, root, sizes=True)


def _remote_listing(fs: Any, root: str, sizes: bool = False) -> list[snapshot_dir.SnapshotInfo]:
    found = []
    names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)] if fs.exists(root) else []
    for name in names:
        match = _NAME.fullmatch(name)
        if not match:
            continue
        meta_file = f"{root}/{name}/{snapshot_dir.META}"
        meta = json.loads(fs.cat_file(meta_file)) if fs.exists(meta_file) else None
        size = fs.du(f"{root}/{name}") if sizes else None
        found.append(snapshot_dir.SnapshotInfo(Path(name), int(match.group(1)), meta, size))
    return sorted(found, key=lambda s: (not s.complete, s.saved_at, s.step))


def _open(url: str) -> tuple[Any, str]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    return fs, root.rstrip("/")
