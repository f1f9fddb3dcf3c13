"""The flags of ``%%accelerate`` / ``%accelerate``, and what they mean to the launcher.

Every launch flag is tri-state: unset (None) leaves the option to the layers
below it (``NOTEBOOK_ACCEL_*`` environment, then the config file, then
auto-detection), so a flag overrides the configured default for one cell only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from IPython.core.magic_arguments import argument, argument_group, magic_arguments

from notebook_accel.launch.environment import DEVICE_TYPE_CHOICES, MIXED_PRECISION_CHOICES
from notebook_accel.launch.output import OUTPUT_CHOICES
from notebook_accel.launch.start_method import START_METHODS

COMMANDS = ("env", "test", "config")


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.replace(",", " ").split() if part.strip())
    bad = [name for name in names if not name.isidentifier()]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of names; give names separated by commas, e.g. model,losses")
    return names


def magic_flags(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the magic with its flags (IPython's ``magic_arguments``; they make ``?`` help)."""
    decorators = [
        magic_arguments(),
        argument("command", nargs="?", choices=COMMANDS, metavar="{env,test,config}",
                 help="line magic only: 'env' reports versions, devices and the config in "
                      "force; 'test' runs a short training sanity check on the workers; "
                      "'config' opens the config panel. Without it (cell magic) the cell "
                      "runs on every worker."),
        argument_group("launch (unset: environment, then config file, then auto-detection)"),
        argument("-n", "--num-processes", type=int, default=None, metavar="N",
                 help="workers on this machine (default: one per GPU, else per CPU core)"),
        argument("--mixed-precision", choices=MIXED_PRECISION_CHOICES, default=None,
                 help="read by Accelerator() in the workers"),
        argument("--start-method", choices=START_METHODS, default=None,
                 help="how workers start (auto: fork when safe, else a warm forkserver)"),
        argument("--device", choices=DEVICE_TYPE_CHOICES, default=None,
                 help="default: CUDA when visible (xla: TPU, where the launcher supports it)"),
        argument("--port", type=int, default=None, help="rendezvous port (default: a free one)"),
        argument("--timeout", type=float, default=None, metavar="SECONDS",
                 help="stop the job after this many seconds"),
        argument("--config", default=None, metavar="FILE",
                 help="config file to read instead of the default one"),
        argument("--fsdp", dest="fsdp", action="store_const", const=True, default=None,
                 help="shard models with FSDP2 (the config file's fsdp_config, else its defaults)"),
        argument("--no-fsdp", dest="fsdp", action="store_const", const=False,
                 help="do not shard, even when the config file says distributed_type: FSDP"),
        argument_group("output"),
        argument("--output", choices=OUTPUT_CHOICES, default=None,
                 help="whose output to show: all ranks (default), the main process, none"),
        argument("--main-only", dest="output", action="store_const", const="main",
                 help="show only rank 0's output (same as --output main)"),
        argument_group("names out (default: every name the cell assigns comes back from rank 0)"),
        argument("--pull", type=_names, default=None, metavar="NAMES",
                 help="bring back only these names (comma-separated)"),
        argument("--no-pull", dest="pull", action="store_const", const=(),
                 help="bring nothing back"),
    ]
    for decorate in reversed(decorators):
        function = decorate(function)
    return function


def launch_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments for ``notebook_launcher`` that the flags set (None: unset)."""
    return {
        "num_processes": args.num_processes,
        "mixed_precision": args.mixed_precision,
        "start_method": args.start_method,
        "device": args.device,
        "use_port": args.port,
        "timeout": args.timeout,
        "config_file": args.config,
        "fsdp": args.fsdp,
        "output": args.output or "all",
    }
