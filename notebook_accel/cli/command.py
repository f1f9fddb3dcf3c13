"""The ``notebook-accel`` command (also ``python -m notebook_accel``).

``notebook-accel env`` reports versions, hardware and the config in force;
``notebook-accel config`` shows or writes the config file without questions;
``notebook-accel launch SCRIPT [ARGS]`` runs a script on N workers and
``notebook-accel test`` checks distributed training works here (both in
:mod:`notebook_accel.cli.launch`); ``notebook-accel snapshots [DIR]`` lists a snapshot
directory (:mod:`notebook_accel.cli.snapshots`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

from notebook_accel import config as cfgmod
from notebook_accel import contract
from notebook_accel.cli import snapshots
from notebook_accel.cli.launch import add_subcommands
from notebook_accel.config.schema import KeyValueError

# config field -> its launch option; each becomes --field-name (notebook_accel.contract's table)
_FIELD_FLAGS: dict[str, contract.LaunchOption] = {
    option.file_key: option for option in contract.OPTIONS.values()
    if contract.config_flag(option) and option.file_key}


def _flag_help(option: contract.LaunchOption) -> str:
    return f"{option.help}; one of {', '.join(option.choices)}" if option.choices else option.help


def _describe(cfg: cfgmod.LaunchConfig) -> list[str]:
    """The config's values, one ``key: value`` line each (unset shown as auto)."""
    lines = [f"  device: {cfg.device_type or 'auto'}"]
    for f in dataclasses.fields(cfg):
        if f.name not in ("extra", "source"):
            value = getattr(cfg, f.name)
            shown = "auto" if value is None else str(value).lower() if isinstance(value, bool) else value
            lines.append(f"  {f.name}: {shown}")
    if cfg.extra:
        lines.append(f"  kept, not used: {', '.join(sorted(cfg.extra))}")
    return lines


def _config_in_force(path: Path | None) -> tuple[cfgmod.LaunchConfig, str]:
    cfg = cfgmod.load_config(path)
    if cfg.source is not None:
        return cfg, str(cfg.source)
    return cfg, f"none (defaults; `notebook-accel config --default` writes {cfgmod.default_config_path()})"


def _cmd_env(args: argparse.Namespace) -> int:
    import torch

    from notebook_accel._version import __version__
    from notebook_accel.machine.hardware import detect

    print(f"notebook_accel: {__version__}")
    print(f"Python: {platform.python_version()} ({platform.python_implementation()}, "
          f"{platform.platform()})")
    print(f"PyTorch: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})")
    print(f"Hardware: {detect().summary()}")
    for var in (contract.CONFIG_FILE_ENV, *contract.ENV_OPTIONS.values()):
        if os.environ.get(var):
            print(f"Environment: {var}={os.environ[var]}")
    cfg, where = _config_in_force(args.config_file)
    print(f"Config file: {where}")
    print("\n".join(_describe(cfg)))
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    target = args.config_file or cfgmod.default_config_path()
    changes = {k: option.check(getattr(args, k), f"flag --{k.replace('_', '-')}", k)
               for k, option in _FIELD_FLAGS.items() if getattr(args, k) is not None}
    if not (args.default or changes or args.device):
        cfg, where = _config_in_force(args.config_file)
        print(f"Config file: {where}")
        print("\n".join(_describe(cfg)))
        return 0
    if args.default:
        if target.exists() and not args.force:
            print(f"notebook-accel config: {target} exists; pass --force to overwrite it",
                  file=sys.stderr)
            return 1
        cfg = cfgmod.detect_default_config()
    elif target.exists():
        cfg = cfgmod.load_config(target)
    else:  # a new file; at the default location, start from the peer's file if there is one
        cfg = cfgmod.LaunchConfig() if args.config_file else cfgmod.load_config()
    device = cfg.device_type if args.device is None else args.device
    try:
        cfg = dataclasses.replace(cfg, **changes)
        cfg = cfg.with_device(cfgmod.device_to_save(None if device == "auto" else device, cfg))
    except KeyValueError as err:
        raise ValueError(f"--{err.key.replace('_', '-')}: {err}") from None
    print(f"Configuration saved to {cfgmod.save_config(cfg, target)}")
    return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="notebook-accel", description="Distributed PyTorch training from notebooks.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config-file", type=Path, default=None, metavar="PATH",
                        help="config file (default: $NOTEBOOK_ACCEL_CONFIG_FILE, else "
                             "~/.cache/notebook_accel/default_config.yaml)")
    env = sub.add_parser("env", parents=[common], help="versions, hardware and the config in force")
    env.set_defaults(func=_cmd_env)
    config = sub.add_parser(
        "config", parents=[common], help="show the config, or write it from flags",
        description="With no flags, show the config in force. With flags, update the file "
                    "(keeping its other keys) and print the path written.")
    config.add_argument("--default", action="store_true",
                        help="write a config detected from this machine's hardware")
    config.add_argument("--force", action="store_true", help="let --default overwrite a file")
    config.add_argument("--device", choices=("auto", *contract.DEVICE_TYPES),
                        help="device type (auto: chosen at launch)")
    for name, option in _FIELD_FLAGS.items():
        kind = option.kind if option.kind in (int, float) else str
        config.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                            help=_flag_help(option),
                            metavar=option.metavar or ("N" if kind is int else "VALUE"))
    config.set_defaults(func=_cmd_config)
    add_subcommands(sub, common)
    snapshots.add_subcommand(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``notebook-accel`` command; returns the exit status.

    Example: ``notebook-accel config --num-processes 2 --mixed-precision bf16``.
    """
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, OSError) as err:
        print(f"notebook-accel {args.command}: error: {err}", file=sys.stderr)
        return 1
