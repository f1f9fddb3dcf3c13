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


def run_script(path: str, argv: list[str]) -> None:
    """Run the file ``path`` as ``__main__`` with ``sys.argv = [path, *argv]`` (in a worker).

    As ``python path ...`` does, the script's directory comes first on ``sys.path``.
    ``sys.exit(0)`` is success; another exit status fails the job with that status.
    """
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def _launch_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"num_processes": args.num_processes, "mixed_precision": args.mixed_precision,
            "start_method": args.start_method, "device": args.device, "use_port": args.port,
            "num_nodes": args.num_machines, "node_rank": args.machine_rank,
            "master_addr": args.main_process_ip, "config_file": args.config_file}


def _cmd_launch(args: argparse.Namespace) -> int:
    from notebook_accel.launch.errors import WorkerError
    from notebook_accel.launch.launcher import notebook_launcher

    script = Path(args.script)
    if not script.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    try:
        notebook_launcher(run_script, args=(str(script), list(args.script_args)),
                          timeout=args.timeout, max_restarts=args.max_restarts,
                          output=args.output, **_launch_options(args))
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
        from notebook_accel.sanity import run_sanity_check
    except ModuleNotFoundError as err:
        if err.name != "notebook_accel.sanity":
            raise
        print("notebook-accel test: notebook_accel.sanity is missing from this installation",
              file=sys.stderr)
        return 1
    options = _launch_options(args)
    layered = cfgmod.resolve_launch_options(
        {"num_processes": options.pop("num_processes")}, cfgmod.load_config(args.config_file))
    passed = run_sanity_check(num_processes=layered["num_processes"] or 2,
                              timeout=args.timeout, **options)
    return 0 if passed else 1


# flag -> (dest, add_argument keywords); each also accepts the peer's --snake_case spelling
_LAUNCH_FLAGS: dict[str, dict[str, Any]] = {
    "--num-processes": dict(type=int, metavar="N", help="workers on this machine (default: one "
                                                        "per GPU, else per CPU core)"),
    "--mixed-precision": dict(choices=("no", "fp16", "bf16")),
    "--start-method": dict(choices=cfgmod.START_METHODS,
                           help="how workers start (auto: fork when safe, else forkserver)"),
    "--device": dict(choices=("cpu", "cuda", "xla"),
                     help="default: CUDA when a GPU is visible, else XLA on a TPU, else CPU"),
    "--main-process-port": dict(dest="port", type=int, metavar="PORT",
                                help="rendezvous port (default: a free one)"),
    "--num-machines": dict(type=int, metavar="N",
                           help="machines in the job (run the same command on each)"),
    "--machine-rank": dict(type=int, metavar="R", help="this machine's rank, 0 on the main one"),
    "--main-process-ip": dict(metavar="ADDR",
                              help="the main machine's address (multi-machine jobs)"),
    "--timeout": dict(type=float, metavar="SECONDS", help="stop the job after this many seconds"),
}


def _add_launch_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("launch (unset: NOTEBOOK_ACCEL_* environment, then the "
                                      "config file, then auto-detection; the peer's "
                                      "--snake_case spellings work too)")
    for flag, keywords in _LAUNCH_FLAGS.items():
        options = {"default": None, "dest": flag[2:].replace("-", "_"), **keywords}
        shorts = {"--num-processes": ["-n"], "--main-process-port": ["--port"]}.get(flag, [])
        group.add_argument(*shorts, flag, **options)
        if "-" in flag[2:]:  # the peer's spelling, not listed in --help
            group.add_argument("--" + flag[2:].replace("-", "_"),
                               **{**options, "help": argparse.SUPPRESS})


def add_subcommands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``launch`` and ``test`` to the ``notebook-accel`` parser's subparsers ``sub``."""
    launch = sub.add_parser(
        "launch", parents=[common], help="run a Python script on N workers",
        usage="notebook-accel launch [options] SCRIPT [ARGS ...]",
        description="Run SCRIPT as __main__ in every worker, with the torchrun-style "
                    "environment that Accelerator() reads; output is prefixed [rank N]. "
                    "The exit status is the failing worker's (1 if it has none).")
    _add_launch_flags(launch)
    launch.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="relaunch the whole job up to N times after a failure")
    launch.add_argument("--output", choices=("all", "main", "none"), default="all",
                        help="whose output to show (default: every rank's)")
    launch.add_argument("script", metavar="SCRIPT", help="the Python file to run")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments for the script (its sys.argv[1:])")
    launch.set_defaults(func=_cmd_launch)
    test = sub.add_parser(
        "test", parents=[common], help="check distributed training works on this machine",
        description="Train a small model on N workers (default: the config's count, else 2) "
                    "and compare with a single-process run; prints PASS/FAIL lines.")
    _add_launch_flags(test)
    test.set_defaults(func=_cmd_test)
