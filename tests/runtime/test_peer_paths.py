"""The peer's module paths under our name, in a fresh interpreter (tests/unit/test_peer_paths.py has the rest)."""

from __future__ import annotations

import subprocess
import sys


def test_a_fresh_interpreter_can_import_a_peer_path_first():
    code = ("import sys; from notebook_accel.state import PartialState; "
            "import notebook_accel.runtime.state as s; assert PartialState is s.PartialState; "
            "import notebook_accel.fsdp.plugin as p, notebook_accel.strategies.fsdp.plugin as q; assert p is q")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_state_path_has_the_peers_state_classes_in_a_fresh_interpreter():
    code = ("from notebook_accel.state import AcceleratorState, GradientState, PartialState; "
            "import notebook_accel.runtime.gradient_state as g; assert GradientState is g.GradientState; "
            "from notebook_accel.accelerator import gather, InitProcessGroupKwargs")
    subprocess.run([sys.executable, "-c", code], check=True)
