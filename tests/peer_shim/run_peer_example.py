"""Run one of the peer's ``examples/by_feature`` scripts against notebook_accel, data loading replaced.

Usage: ``run_peer_example.py OUT_DIR SCRIPT [ARGS...]`` in every worker (``torchrun``,
``notebook-accel launch``), or
``run_peer_example.py --launcher OUT_DIR SCRIPT [ARGS...]`` once (our ``notebook_launcher`` forks
2 workers).
``accelerate`` resolves to the shim package beside this file; ``stand_ins.install()``
replaces what the script would download (datasets, metrics, tokenizer, weights); then
the script's ``main()`` runs with ``sys.argv = [SCRIPT, *ARGS]``, its code unchanged
except where ``CPU_CHANGES`` says why. Each rank writes ``OUT_DIR/<script>_rank<r>.json``
(the shim's path, the real accelerate modules imported, which must be none, and the
traceback when it failed).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

SHIM = Path(__file__).resolve().parent


def _device_memory_zero_on_cpu(module: Any) -> None:
    # fsdp_with_peak_mem_tracking's TorchTracemalloc reads the accelerator's allocator only
    # (CUDA/XPU/NPU) and sets begin/end/peak only there, so on a CPU it fails with
    # AttributeError. On a CPU that memory is 0; its CPU measurements (psutil) are unchanged.
    module.TorchTracemalloc.begin = module.TorchTracemalloc.end = module.TorchTracemalloc.peak = 0


CPU_CHANGES = {"fsdp_with_peak_mem_tracking.py": _device_memory_zero_on_cpu}


def run(out_dir: Path, script: Path, args: list[str]) -> None:
    """Run ``script``'s ``main()`` with ``args``; write this rank's report even when it fails."""
    if str(SHIM) not in sys.path[:1]:
        sys.path.insert(0, str(SHIM))
    import stand_ins
    from run_peer_script import _load, _peer_modules

    stand_ins.install()
    rank = int(os.environ.get("RANK", "0"))
    report: dict[str, Any] = {"script": script.name, "rank": rank, "finished": False}
    try:
        sys.argv = [str(script), *args]
        module = _load(script)
        import accelerate  # the shim, as the script's own imports found it

        report["shim"] = accelerate.__file__
        if script.name in CPU_CHANGES:
            CPU_CHANGES[script.name](module)
            report["changed"] = CPU_CHANGES[script.name].__name__
        module.main()
        report["finished"] = True
    except BaseException:
        report["error"] = traceback.format_exc()
        raise
    finally:
        report["leaked"] = _peer_modules()
        (out_dir / f"{script.stem}_rank{rank}.json").write_text(json.dumps(report, indent=1))


def launch(out_dir: Path, script: Path, args: list[str], num_processes: int = 2) -> None:
    """``run`` on ``num_processes`` workers forked by our ``notebook_launcher`` once the libraries
    the examples use are imported here (each worker inherits them instead of importing its own)."""
    if str(SHIM) not in sys.path[:1]:
        sys.path.insert(0, str(SHIM))
    import stand_ins

    stand_ins.install()  # imports datasets and transformers
    from notebook_accel import notebook_launcher

    notebook_launcher(run, (out_dir, script, args), num_processes=num_processes, start_method="fork")


if __name__ == "__main__":
    if sys.argv[1] == "--launcher":
        launch(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
    else:
        run(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
