"""``notebook-accel launch SCRIPT [ARGS]`` and ``notebook-accel test``.

``launch`` runs a script on N workers with the notebook's engine
(:func:`~notebook_accel.notebook_launcher`: same environment, same ``[rank N] ``
output, same supervision), so code written in a notebook leaves it unchanged.
Unset flags come from ``NOTEBOOK_ACCEL_*`` variables, then the config file.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from notebook_accel import config as cfgmod
from notebook_accel import contract
from notebook_accel.launch.planning.request import LaunchRequest, launch_options


def run_script(path: str, argv: list[str]) -> None:
    """Run the file ``path`` as ``__main__`` with ``sys.argv = [path, *argv]`` (in a worker).

    As ``python path ...`` does, the script's directory comes first on ``sys.path``.
    ``sys.exit(0)`` is success; another exit status fails the job with that status.
    """
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def _launch_flags(launch: bool) -> list[contract.LaunchOption]:
    """The options with a flag on ``launch`` (True) or ``test``, in the table's order
    (``--config-file`` is every subcommand's)."""
    return [option for option in launch_options().values()
            if option.cli_flag and option.name != "config_file"
            and (launch or not option.cli_launch_only)]


def _request(args: argparse.Namespace) -> LaunchRequest:
    """The launch flags given, each checked against its row (a bad one is named by its flag)."""
    return LaunchRequest.from_flags({option.name: getattr(args, option.name, None)
                                     for option in launch_options().values() if option.cli_flag},
                                    "cli")


def _cmd_launch(args: argparse.Namespace) -> int:
    from notebook_accel.launch.launcher import launch_request
    from notebook_accel.launch.supervision.errors import WorkerError

    script = Path(args.script)
    if not script.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    try:
        launch_request(run_script, _request(args), args=(str(script), list(args.script_args)))
    except WorkerError as error:
        print(f"notebook-accel launch: {error}", file=sys.stderr)
        code = error.exitcode
        return code if isinstance(code, int) and 0 < code < 256 else 1
    except KeyboardInterrupt:
        print("notebook-accel launch: interrupted; every worker was stopped", file=sys.stderr)
        return 130
    return 0


def _cmd_test(args: argparse.Namespace) -> int:
    try:
        from notebook_accel.cli.sanity import run_sanity_check
    except ModuleNotFoundError as err:
        if err.name != "notebook_accel.cli.sanity":
            raise
        print("notebook-accel test: notebook_accel.cli.sanity is missing from this installation",
              file=sys.stderr)
        return 1
    request = _request(args)
    num_processes = request.get("num_processes")
    if num_processes is None:  # the environment's, the file's, else 2
        layered = cfgmod.resolve_launch_options({}, cfgmod.load_config(args.config_file))
        num_processes = layered["num_processes"] or 2
    passed = run_sanity_check(num_processes=num_processes, request=request)
    return 0 if passed else 1


_ALIASES = {"--main-process-port": ["--port"]}


def _flag_keywords(option: contract.LaunchOption) -> dict[str, Any]:
    """``add_argument``'s keywords for ``option``: choices, or a type and a metavar."""
    if option.choices:
        return {"choices": option.choices, "help": option.help}
    kind = option.kind if option.kind in (int, float) else str
    return {"type": kind, "help": option.help,
            "metavar": option.metavar or ("N" if kind is int else "VALUE")}


def _add_launch_flags(parser: argparse.ArgumentParser, launch: bool) -> None:
    group = parser.add_argument_group("launch (unset: NOTEBOOK_ACCEL_* environment, then the "
                                      "config file, then auto-detection; the peer's "
                                      "--snake_case spellings work too)")
    for option in _launch_flags(launch):
        flag = option.cli_flag
        keywords = {"default": None, "dest": option.name, **_flag_keywords(option)}
        shorts = [option.short_flag] if option.short_flag else []
        group.add_argument(*shorts, *_ALIASES.get(flag, []), flag, **keywords)
        if "-" in flag[2:]:  # the peer's spelling, not listed in --help
            group.add_argument("--" + flag[2:].replace("-", "_"),
                               **{**keywords, "help": argparse.SUPPRESS})


def add_subcommands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``launch`` and ``test`` to the ``notebook-accel`` parser's subparsers ``sub``."""
    launch = sub.add_parser(
        "launch", parents=[common], help="run a Python script on N workers",
        usage="notebook-accel launch [options] SCRIPT [ARGS ...]",
        description="Run SCRIPT as __main__ in every worker, with the torchrun-style "
                    "environment that Accelerator() reads; output is prefixed [rank N]. "
                    "The exit status is the failing worker's (1 if it has none).")
    _add_launch_flags(launch, launch=True)
    launch.add_argument("script", metavar="SCRIPT", help="the Python file to run")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script (its sys.argv[1:])")
    launch.set_defaults(func=_cmd_launch)
    test = sub.add_parser(
        "test", parents=[common], help="check distributed training works on this machine",
        description="Train a small model on N workers (default: the config's count, else 2) "
                    "and compare with a single-process run; prints PASS/FAIL lines.")
    _add_launch_flags(test, launch=False)
    test.set_defaults(func=_cmd_test)
