"""Shared pieces of the runtime tests (tests/runtime/): torchrun in a clean environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from notebook_accel.launch.handoff.ports import free_port


def run_torchrun(args: list[str], nproc: int = 2, timeout: float = 150,
                 extra_env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """Run ``torchrun --nproc-per-node NPROC ARGS...`` in a clean environment (plus ``extra_env``).

    Returns ``(returncode, output)``; ``returncode`` is ``None`` when it ran past
    ``timeout`` (then the whole session was killed). Leaves no process behind.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTEBOOK_ACCEL_", "ACCELERATE_"))}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra_env or {})
    env["DDP_CHECKS_TIMEOUT"] = str(int(timeout) - 20)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        returncode = None
    finally:
        try:  # the whole session: torchrun and its workers
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return returncode, output


def torchrun(script: Path, out: Path, phase: str | None, nproc: int = 2, timeout: float = 150) -> list[dict]:
    """Run ``script OUT [PHASE]`` under torchrun; return each rank's ``<phase>_rank<r>.json``.

    With ``phase=None`` nothing is read back. Leaves no process behind.
    """
    returncode, output = run_torchrun([str(script), str(out), *([phase] if phase else [])], nproc, timeout)
    if returncode is None:
        pytest.fail(f"torchrun {phase} timed out:\n{output[-4000:]}")
    assert returncode == 0, f"torchrun {phase} failed ({returncode}):\n{output[-6000:]}"
    if phase is None:
        return []
    return [json.loads((out / f"{phase}_rank{r}.json").read_text()) for r in range(nproc)]
