"""Run one of the peer's test scripts against notebook_accel and count its checks.

Usage: ``run_peer_script.py SCRIPT OUT_DIR`` (under ``torchrun``, or through
``run(...)`` from ``notebook_launcher``). The script's module-level check functions
(``test_*``, ``check_*``, ``*_check``) are wrapped before its ``main()`` runs: a
check *passed* when every call returned, *skipped* when ``main()`` never called it
(it needs a GPU/XPU/TPU, more processes, or a missing package), *changed* when the
test replaced it (see ``CHANGED``). Each rank writes ``OUT_DIR/<script>_rank<r>.json``
and raises on the first failing check, as the script itself would.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

SHIM = Path(__file__).resolve().parent
CHECK = re.compile(r"^(test_|check_)|_check$")


# -- checks the test replaces: where our semantics deliberately differ (say why) ----------------
def _reinstantiated_state_ours() -> None:
    # The peer's AcceleratorState is a shared singleton: after _reset_state() an existing
    # Accelerator breaks with AttributeError, which that check expects. Ours has no shared
    # state (docs/peer_compat.md: several Accelerators in one process never interfere), so a reset
    # breaks nothing and the Accelerator keeps working; this is what we check instead.
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    accelerator = Accelerator()
    AcceleratorState._reset_state()
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    assert accelerator.unwrap_model(model).weight.shape == (1, 1)


# Checks the peer's main() calls only on GPU-type backends although they need no GPU:
# the test calls them on MULTI_CPU too (same arguments as the peer's loops; several processes only).
def _sync_accumulation_loops(module: Any) -> None:
    for split in (True, False):
        for dispatch in (True, False):
            for sync_each_batch in (True, False):
                module.test_gradient_accumulation(split, dispatch, sync_each_batch)
                if split or dispatch or sync_each_batch:
                    module.test_gradient_accumulation_with_opt_and_scheduler(split, dispatch, sync_each_batch)


UNGATED = {"test_sync.py": _sync_accumulation_loops}

# Checks that run here but only assert something on a GPU/XPU/TPU: counted as skipped.
GATED = {
    "test_ops.py": {"test_copy_tensor_to_devices": "MULTI_GPU or XLA only"},
    "test_notebook.py": {"test_clean_cuda_fork": "asserts only when CUDA is available"},
}

def _tough_nut_every_rank(queue: Any) -> None:
    from accelerate import PartialState

    state = PartialState()  # every rank joins the job before rank 0 decides
    if state.process_index == 0:
        trial = queue.get()
        if trial > 0:
            queue.put(trial - 1)
            queue.close()
            queue.join_thread()  # the count reaches the next attempt even though we raise
            raise RuntimeError("The nut hasn't cracked yet! Try again.")
    state.wait_for_everyone()
    print(f"PartialState:\n{state}")


def _fault_tolerant_ours(max_restarts: int = 3) -> None:
    # The peer's tough_nut_function races: each rank checks queue.empty() and the one
    # that sees it empty returns at once, while the other blocks in the process-group
    # rendezvous for it (a hang on a loaded machine); and the count it puts back is
    # lost when the worker exits right after. Same check, deterministic: every rank
    # joins, rank 0 fails 3 times, the 4th launch (3rd restart) succeeds, and the
    # queue passed as an argument (inherited by the forked workers) carries the count.
    import multiprocessing

    from accelerate import notebook_launcher

    module = sys.modules["peer_script"]
    queue = multiprocessing.get_context("fork").Queue()
    queue.put(max_restarts)
    notebook_launcher(_tough_nut_every_rank, (queue,), num_processes=module.NUM_PROCESSES,
                      max_restarts=max_restarts)
    assert queue.empty(), "the launch succeeded before the nut cracked"


CHANGED = {
    "test_script.py": {"test_reinstantiated_state": _reinstantiated_state_ours},
    "test_notebook.py": {"test_fault_tolerant": _fault_tolerant_ours},
}


def _load(script: Path) -> Any:
    spec = importlib.util.spec_from_file_location("peer_script", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules["peer_script"] = module
    spec.loader.exec_module(module)
    return module


def _wrap(name: str, function: Any, calls: dict[str, list[bool]]) -> Any:
    @functools.wraps(function)
    def counted(*args: Any, **kwargs: Any) -> Any:
        record = calls.setdefault(name, [])
        try:
            result = function(*args, **kwargs)
        except BaseException:
            record.append(False)
            raise
        record.append(True)
        return result

    return counted


def _peer_modules() -> list[str]:
    """Modules named ``accelerate*`` that are neither our shim's views nor notebook_accel's modules the
    shim aliases (``accelerate.logging`` is ``notebook_accel.logging``): the real package, if it leaked in."""
    import notebook_accel

    ours = (SHIM, Path(notebook_accel.__file__).resolve().parent)
    leaked = []
    for name, module in list(sys.modules.items()):
        if name == "accelerate" or name.startswith("accelerate."):
            where = getattr(module, "__file__", None)
            if where is not None and not any(Path(where).resolve().is_relative_to(root) for root in ours):
                leaked.append(f"{name} ({where})")
    return leaked


def run(script: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Run ``script``'s ``main()`` with counted checks; returns (and writes) this rank's counts."""
    if str(SHIM) not in sys.path[:1]:
        sys.path.insert(0, str(SHIM))
    script, out_dir = Path(script), Path(out_dir)
    module = _load(script)
    import accelerate  # the shim, as the script's own imports found it

    changed = CHANGED.get(script.name, {})
    calls: dict[str, list[bool]] = {}
    checks = [n for n, f in vars(module).items()
              if CHECK.search(n) and callable(f) and getattr(f, "__module__", None) == "peer_script"]
    for name in checks:
        setattr(module, name, _wrap(name, changed.get(name, getattr(module, name)), calls))
    rank = int(os.environ.get("RANK", "0"))
    report: dict[str, Any] = {"script": script.name, "rank": rank, "shim": accelerate.__file__}
    gated = GATED.get(script.name, {})
    try:
        if script.name in UNGATED and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            UNGATED[script.name](module)
        module.main()
    finally:
        report["passed"] = sorted(n for n in checks if calls.get(n) and all(calls[n]) and n not in gated)
        report["failed"] = sorted(n for n in checks if calls.get(n) and not all(calls[n]))
        report["skipped"] = sorted(n for n in checks if n not in calls or n in gated)
        report["changed"] = sorted(n for n in changed if n in calls)
        report["calls"] = sum(len(v) for v in calls.values())
        report["leaked"] = _peer_modules()
        (out_dir / f"{script.stem}_rank{rank}.json").write_text(json.dumps(report, indent=1))
    return report


def run_through_launcher(script: str, out_dir: str, num_processes: int = 2) -> None:
    """``run(script, out_dir)`` on ``num_processes`` workers started by our ``notebook_launcher``."""
    from notebook_accel import notebook_launcher

    notebook_launcher(run, (str(Path(script).resolve()), str(Path(out_dir).resolve())), num_processes=num_processes)


if __name__ == "__main__":
    if sys.argv[1] == "--launcher":
        run_through_launcher(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[1], sys.argv[2])
