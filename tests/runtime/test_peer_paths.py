"""The peer's module paths under our name, in a fresh interpreter (tests/unit/test_peer_paths.py has the rest)."""

from __future__ import annotations

import subprocess
import sys


def test_a_fresh_interpreter_can_import_a_peer_path_first():
    code = ("import sys; from notebook_accel.state import PartialState; "
            "import notebook_accel.runtime.state as s; assert PartialState is s.PartialState; "
            "import notebook_accel.fsdp.plugin as p, notebook_accel.strategies.fsdp.plugin as q; assert p is q")
    subprocess.run([sys.executable, "-c", code], check=True)
