"""Both sides of a benchmark in one run: BASELINE checked out in a throwaway git worktree, this
checkout as it is. A side is the benchmark's own script run again in its own process, against
that side's code (``PYTHONPATH``), printing one ``FIGURES <json>`` line."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def baseline_worktree(revision: str) -> Iterator[Path]:
    """A worktree of ``revision``, removed afterwards."""
    with tempfile.TemporaryDirectory() as work:
        base = Path(work) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                        revision], check=True)
        try:
            yield base
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False)


def run_side(script: str, directory: Path, arguments: list[str], timeout: float) -> dict:
    """The figures of ``script arguments`` run against ``directory``'s code, or ``{"error": its
    last output}`` when it printed none."""
    out = subprocess.run([sys.executable, script, *arguments], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(directory)), cwd=directory,
                         timeout=timeout, check=False)
    line = next((line for line in out.stdout.splitlines() if line.startswith("FIGURES ")), None)
    if line is None:
        return {"error": (out.stdout[-1500:] + out.stderr[-1500:]).strip()}
    return json.loads(line[len("FIGURES "):])
