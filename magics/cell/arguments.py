"""The flags of ``%%accelerate`` / ``%accelerate``, and what they mean to the launcher.

The launch flags are the launch options' ``magic_flag`` rows (``notebook_accel.launch.
launch_options``: the table's and the strategies'), in the table's order. Every launch flag is
tri-state: unset (None) leaves the option to the layers below it (``NOTEBOOK_ACCEL_*``
environment, then the config file, then auto-detection), so a flag overrides the configured
default for one cell only; a ``switch`` row is a pair, ``--fsdp`` / ``--no-fsdp``.
"""

from __future__ import annotations

import argparse
import functools
import operator
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, argument_group, magic_arguments, parse_argstring

from notebook_accel.contract import LaunchOption
from notebook_accel.launch import LaunchRequest
from notebook_accel.launch import launch_options as options_table

COMMANDS = ("env", "test", "config", "start", "status", "restart", "stop", "debug", "stacks",
            "snapshots", "collectives", "watch", "pools", "attach")
# the commands that take one word after them: snapshots DIR, attach NAME, stop NAME
WITH_ARGUMENT = ("snapshots", "attach", "stop")


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.replace(",", " ").split() if part.strip())
    bad = [name for name in names if not name.isidentifier()]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of names; give names separated by commas, e.g. model,losses")
    return names


_IMMUTABLE = (type(None), bool, int, float, str, tuple)


def parse_line(magic: Callable[..., Any], line: str) -> argparse.Namespace:
    """``parse_argstring(magic, line)``; a line parsed before (a cell run again) is not parsed
    again: each call gets its own copy, where every value is immutable (the last 64 lines)."""
    kept = _parsed(magic, line)
    return parse_argstring(magic, line) if kept is None else argparse.Namespace(**vars(kept))


@functools.lru_cache(maxsize=64)
def _parsed(magic: Callable[..., Any], line: str) -> argparse.Namespace | None:
    """The line parsed, to be copied; None where a value could be changed in place."""
    parsed = parse_argstring(magic, line)
    return parsed if all(isinstance(v, _IMMUTABLE) for v in vars(parsed).values()) else None


_rows: tuple[tuple[LaunchOption, ...], tuple[tuple[LaunchOption, str], ...]] = ((), ())


def _flagged() -> tuple[tuple[LaunchOption, str], ...]:
    """The launch options that have a flag, each with its name in the parsed line: the table's as
    it is now (a row added is a flag of the parsers built from then on), worked out again only
    when a row changed."""
    global _rows
    rows = tuple(options_table().values())
    if len(rows) != len(_rows[0]) or not all(map(operator.is_, rows, _rows[0])):
        _rows = (rows, tuple((option, _dest(option)) for option in rows if option.magic_flag))
    return _rows[1]


def _dest(option: LaunchOption) -> str:
    return option.magic_flag[2:].replace("-", "_")


def _flags(option: LaunchOption) -> list[Callable[..., Any]]:
    """The ``argument`` decorators for ``option``'s ``%%accelerate`` flag(s), from its row."""
    if option.switch:
        return [argument(option.magic_flag, dest=_dest(option), action="store_const", const=True,
                         default=None, help=option.help),
                argument("--no-" + option.magic_flag[2:], dest=_dest(option),
                         action="store_const", const=False,
                         help=f"not {option.name}, even when the config file says so")]
    shorts = [option.short_flag] if option.short_flag else []
    if option.choices:
        return [argument(*shorts, option.magic_flag, choices=option.choices, default=None,
                         help=option.help)]
    kind = option.kind if option.kind in (int, float) else str
    return [argument(*shorts, option.magic_flag, type=kind, default=None, help=option.help,
                     metavar=option.metavar or ("N" if kind is int else "VALUE"))]


def magic_flags(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the magic with its flags (IPython's ``magic_arguments``; they make ``?`` help)."""
    decorators = [
        magic_arguments(),
        argument("command", nargs="?", choices=COMMANDS,
                 metavar="{env,test,config,start,status,restart,stop,debug,stacks,snapshots,collectives,watch,pools,attach}",
                 help="line magic only: 'env' reports versions, devices and the config in "
                      "force; 'test' runs a short training sanity check on the workers; "
                      "'config' opens the config panel; 'start' starts the notebook's warm "
                      "pool (with the launch flags), 'status' shows it, 'restart' gives it "
                      "fresh workers, 'stop' ends it; 'debug' opens pdb on the rank that "
                      "failed the pool's last run, 'stacks' shows every rank's stack, "
                      "'collectives' every rank's last collectives side by side (--last N); "
                      "'snapshots [DIR]' lists a snapshot directory's snapshots; "
                      "'watch' shows the pool's background cell live; 'pools' lists this "
                      "user's detached pools, 'attach [NAME]' makes one the notebook's pool, "
                      "'stop NAME' ends one. "
                      "Without it (cell magic) the cell runs on every worker (on the pool's, "
                      "while one is up)."),
        argument("target", nargs="?", default=None, metavar="DIR|NAME",
                 help="with snapshots: the snapshot directory (default: the snapshot_dir in "
                      "force, else ./snapshots/<run>); with attach or stop: a detached pool's "
                      "name"),
        argument_group("launch (unset: environment, then config file, then auto-detection)"),
        *(flag for option, _ in _flagged() for flag in _flags(option)),
        argument_group("output"),
        argument("--main-only", dest="output", action="store_const", const="main",
                 help="show only rank 0's output (same as --output main)"),
        argument("--fresh", action="store_true",
                 help="run this cell on fresh workers even while a pool is up"),
        argument("--background", action="store_true",
                 help="on the pool: run this cell in the background; the notebook stays free "
                      "(%accelerate watch shows it live; its names stay on the workers)"),
        argument("--ranks", default=None, metavar="RANKS",
                 help="on the pool: run this cell on these ranks only (1, 0,2-3); the cell's "
                      "value comes from the first of them, names come back only with --pull"),
        argument("--last", type=int, default=None, metavar="N",
                 help="%%accelerate collectives only: how many of each group's last "
                      "collectives to show per rank (default 8)"),
        argument("--push", type=_names, default=(), metavar="NAMES",
                 help="on the pool: send these notebook names even though the workers hold "
                      "their own, replacing theirs (comma-separated)"),
        argument_group("names out (default: every name the cell assigns comes back from rank 0)"),
        argument("--pull", type=_names, default=None, metavar="NAMES",
                 help="bring back only these names (comma-separated)"),
        argument("--no-pull", dest="pull", action="store_const", const=(),
                 help="bring nothing back"),
    ]
    for decorate in reversed(decorators):
        function = decorate(function)
    return function


def flags_given(args: argparse.Namespace) -> list[str]:
    """The launch flags set on the line (``--num-processes``...), as written in ``--help``."""
    return [option.magic_flag for option, dest in _flagged() if getattr(args, dest) is not None]


def pool_flags_given(args: argparse.Namespace) -> list[str]:
    """The flags set on the line that only a pool's start takes (``--heal``, ``--no-heal``...)."""
    return [f"--no-{option.magic_flag[2:]}" if option.switch and getattr(args, dest) is False
            else option.magic_flag for option, dest in _flagged()
            if option.pool_only and getattr(args, dest) is not None]


_CELL_ONLY = {"fresh": ("--fresh", False), "background": ("--background", False),
              "ranks": ("--ranks", None), "push": ("--push", ()),
              "pull": ("--pull/--no-pull", None)}  # dest -> (flag, its value when not given)
# the launch flags each line command reads (None: all of them)
_READS: dict[str, tuple[str, ...] | None] = {"test": None, "start": None, "restart": None,
                                             "env": ("--config",), "config": ("--config",),
                                             "snapshots": ("--config",),
                                             "attach": ("--cluster",),
                                             "pools": ("--cluster",),
                                             "stop": ("--cluster",)}


def unused_flags(args: argparse.Namespace) -> list[str]:
    """The flags on a line command's line that it does not read (``%accelerate status -n 2``),
    as written in ``--help``: refused by name rather than ignored."""
    reads = _READS.get(args.command, ())
    unused = [flag for flag in flags_given(args) if reads is not None and flag not in reads]
    if args.last is not None and args.command != "collectives":
        unused.append("--last")
    return unused + [flag for dest, (flag, unset) in _CELL_ONLY.items()
                     if getattr(args, dest) != unset]


def launch_options(args: argparse.Namespace) -> LaunchRequest:
    """The launch options the flags set, each checked (``notebook_launcher(fn, **request)``,
    ``WorkerPool(**request)``).

    Raises:
        UsageError: a bad value, named by its flag, with the valid values.
    """
    try:
        return LaunchRequest.from_flags(
            {option.name: getattr(args, dest) for option, dest in _flagged()}, "magic")
    except ValueError as error:
        raise UsageError(str(error)) from None
