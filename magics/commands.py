"""The line magic's commands: ``%accelerate env``, ``test``, ``config`` and ``snapshots``."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from IPython.core.error import UsageError

from magics import config_hint
from magics.cell.arguments import launch_options


class SanityCheckFailed(RuntimeError):
    """``%accelerate test`` found a problem (the PASS/FAIL lines above say which)."""

    def _render_traceback_(self) -> list[str]:
        """IPython hook: one line; the details were printed as the check ran."""
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self.args[0]}"]


def _version(module_name: str) -> str:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return "not installed"
    return getattr(module, "__version__", "installed")


def env(args: argparse.Namespace) -> None:
    """Versions, devices and the config in force (the ``notebook-accel env`` report),
    plus what matters in this kernel: the notebook packages and the start method."""
    from notebook_accel.cli import main
    from notebook_accel.launch import fork_unsafe_reason, launch_in_force

    main(["env", *(["--config-file", args.config] if args.config else [])])
    try:
        print(launch_in_force(args.config))
    except ValueError as error:
        print(f"A launch here would fail: {error}")
    print(f"IPython: {_version('IPython')}; ipywidgets: {_version('ipywidgets')}")
    reason = fork_unsafe_reason()
    print("Start method 'auto' in this kernel: "
          + ("fork" if reason is None else f"forkserver ({reason})"))


def test(args: argparse.Namespace) -> None:
    """Run :func:`notebook_accel.cli.sanity.run_sanity_check` with the magic's launch flags;
    unset ones come from the environment and the config file, as for a cell.

    Raises:
        SanityCheckFailed: a check failed.
        UsageError: a bad launch option.
    """
    from notebook_accel.cli.sanity import run_sanity_check

    request = launch_options(args)
    try:
        passed = run_sanity_check(request.get("num_processes"), request=request)
    except ValueError as error:  # a bad option or config value
        raise UsageError(str(error)) from None
    if not passed:
        raise SanityCheckFailed("the sanity check failed; see the FAIL lines above")


PANEL_MISSING = ("The configuration panel is not available in this installation yet. Meanwhile, "
                 "`%accelerate env` shows the config in force, and:\n" + config_hint.TERMINAL)


def config(args: argparse.Namespace) -> Any:
    """Show the config panel (``magics.panel.config_panel()``) if it is installed.

    Raises:
        UsageError: ipywidgets, which the panel needs, is missing.
    """
    try:
        panel = importlib.import_module("magics.panel.form")
    except ModuleNotFoundError as error:
        if error.name == "ipywidgets":
            raise UsageError("the config panel needs ipywidgets: pip install ipywidgets, then "
                             "run %accelerate config again") from None
        if error.name != "magics.panel.form":
            raise
        print(PANEL_MISSING)
        return None
    return panel.config_panel(**({"config_file": args.config} if args.config else {}))


def snapshots(args: argparse.Namespace) -> None:
    """List a snapshot directory (``args.target``, else where a launch from this kernel
    snapshots by default): :func:`notebook_accel.cli.snapshots.describe`.

    Raises:
        UsageError: a bad ``snapshot_dir`` in the environment or the config file, or a URL.
    """
    from notebook_accel.cli import snapshots as listing

    directory = args.target
    if directory and len(directory) > 1 and directory[0] == directory[-1] and directory[0] in "'\"":
        directory = directory[1:-1]  # IPython's magic lines keep the quotes of 'a path with spaces'
    try:
        print(listing.describe(directory or listing.default_directory(args.config))[1])
    except ValueError as error:
        raise UsageError(str(error)) from None
