"""Where the config file lives, and reading and writing it (YAML, ``yaml.safe_load``)."""

from __future__ import annotations

import dataclasses
import difflib
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import yaml

from notebook_accel.config.dynamo import SECTION as DYNAMO_SECTION
from notebook_accel.config.schema import (
    STRATEGY_SECTIONS,
    UNSUPPORTED_DISTRIBUTED_TYPES,
    KeyValueError,
    LaunchConfig,
)
from notebook_accel.contract import CONFIG_FILE_ENV

# Keys of the peer's file that we read past; reported only when set to something that matters.
_PEER_INERT: dict[str, tuple[Any, ...]] = {
    "debug": (False,), "downcast_bf16": (False, "no"), "enable_cpu_affinity": (False,),
    "rdzv_backend": ("static",), "same_network": (True, False),
    "main_training_function": ("main",), "tpu_use_cluster": (False,), "tpu_use_sudo": (False,),
    **{k: () for k in ("deepspeed_config", "fsdp_config", "megatron_lm_config", "mpirun_config",
                       "fp8_config", "parallelism_config", "ipex_config",
                       "tpu_name", "tpu_zone", "command_file", "commands", "tpu_vm", "tpu_env")},
}
_reported: set[tuple[str, tuple[str, ...]]] = set()


def default_config_path() -> Path:
    """Where our config file lives: ``$NOTEBOOK_ACCEL_CONFIG_FILE``, else
    ``$XDG_CACHE_HOME/notebook_accel/default_config.yaml`` (``~/.cache/...``)."""
    if os.environ.get(CONFIG_FILE_ENV):
        return Path(os.environ[CONFIG_FILE_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser() / "notebook_accel" / "default_config.yaml"


def peer_config_path() -> Path:
    """Accelerate's default file: ``$HF_HOME/accelerate/default_config.yaml``."""
    hf_home = os.environ.get("HF_HOME") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface")
    return Path(hf_home).expanduser() / "accelerate" / "default_config.yaml"


def find_config_file() -> Path | None:
    """The file :func:`load_config` reads when given no path, or None if there is none.

    The peer's file is a fallback only for our default location, not when
    ``$NOTEBOOK_ACCEL_CONFIG_FILE`` names a file that does not exist yet.
    """
    ours = default_config_path()
    if ours.is_file() or os.environ.get(CONFIG_FILE_ENV):
        return ours if ours.is_file() else None
    peer = peer_config_path()
    return peer if peer.is_file() else None


def _key_lines(text: str) -> dict[str, int]:
    """1-based line of each top-level key (composed, never constructed: safe)."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def where_in_file(path: Path, key: str) -> str:
    """``"PATH, line N"`` for ``key`` in the file (``"PATH"`` when the line is unknown), to
    start an error about that key's value."""
    try:
        line = _key_lines(Path(path).read_text(encoding="utf-8")).get(key)
    except (OSError, yaml.YAMLError):
        line = None
    return f"{path}, line {line}" if line else str(path)


def _report_unused(cfg: LaunchConfig, path: Path) -> None:
    """Warn once per file about keys we keep but do not act on."""
    known = {f.name for f in dataclasses.fields(LaunchConfig)} | set(_PEER_INERT) | {DYNAMO_SECTION}
    unknown = sorted(str(k) for k in cfg.extra if k not in known)
    ignored = sorted(k for k, v in cfg.extra.items() if k in _PEER_INERT
                     and v not in (None, {}, [], "") and v not in _PEER_INERT[k]
                     and k != STRATEGY_SECTIONS.get(cfg.distributed_type))
    notes = [f"unknown key {k!r}" + "".join(
        f" (did you mean {m!r}?)" for m in difflib.get_close_matches(k, known, 1)) for k in unknown]
    notes += [f"{k!r} is not used by notebook_accel" for k in ignored]
    if cfg.distributed_type in UNSUPPORTED_DISTRIBUTED_TYPES:
        notes.append(f"distributed_type {cfg.distributed_type!r} is not supported by "
                     "notebook_accel; the device will be auto-detected")
    token = (str(path), tuple(notes))
    if notes and token not in _reported:
        _reported.add(token)
        warnings.warn(f"{path}: " + "; ".join(notes) + " (kept when the file is saved)",
                      UserWarning, stacklevel=3)


def load_config(path: str | os.PathLike[str] | None = None) -> LaunchConfig:
    """Read a launch config file.

    Args:
        path: the file; default :func:`find_config_file` (ours, else the peer's).
    Returns:
        The :class:`LaunchConfig`; a default one (``source=None``) when ``path`` is
        None and there is no file at all.
    Raises:
        FileNotFoundError: ``path`` was given and does not exist.
        ValueError: malformed YAML (file and line) or a bad value (file, key, line,
            valid values).
    """
    file = Path(path).expanduser() if path is not None else find_config_file()
    if file is None:
        return LaunchConfig()
    text = file.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or err
        raise ValueError(f"{file}{where}: malformed YAML: {problem}") from err
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a mapping of keys to values, such as "
                         f"'num_processes: 2', got {type(data).__name__}")
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise ValueError(f"{file}: keys must be names such as 'num_processes', got {bad_keys[0]!r}")
    try:
        cfg = LaunchConfig.from_dict(data, source=file)
    except KeyValueError as err:
        line = _key_lines(text).get(err.key)
        raise ValueError(f"{file}" + (f", line {line}" if line else "") + f": {err}") from None
    _report_unused(cfg, file)
    return cfg


def save_config(cfg: LaunchConfig, path: str | os.PathLike[str] | None = None) -> Path:
    """Write ``cfg`` as YAML, atomically, with mode 0600 (the directory 0700 if created).

    Args:
        cfg: the configuration; its :attr:`~LaunchConfig.extra` keys are written too.
        path: the file; default :func:`default_config_path` (never the peer's file).
    Returns:
        The path written.
    """
    file = Path(path).expanduser() if path is not None else default_config_path()
    if not file.parent.is_dir():
        file.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(file.parent, 0o700)
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=True, default_flow_style=False)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return file
