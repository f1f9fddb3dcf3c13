"""Run the peer's own ``tests/`` files (accelerate 1.15.0's sdist) against notebook_accel; print the counts.

Usage: ``python tests/peer_shim/run_peer_tests.py [FILE ...]``. The sdist
(``.peer_sdist/accelerate-1.15.0.tar.gz``, which ``scripts/_venv.sh`` downloads) is
opened at run time: its ``tests/`` files and its test harness
(``accelerate/test_utils/testing.py``, ``training.py``: skip decorators, TestCase bases,
fixture models) are extracted into a temporary directory, never into the repository. One
pytest process runs them with the shim ``accelerate`` (this directory) first on
``sys.path``, so every ``accelerate`` name they use is ours; the plugin
(``peer_pytest_plugin.py``) deselects ``DEPARTURES`` and counts outcomes per file, and
reports any real ``accelerate`` module imported (there must be none).

Left out, as out of scope: ``test_cli.py``, ``test_launch.py`` (the peer's own
``accelerate`` CLI and its ``launch`` command: ours is ``notebook_launcher`` / torchrun),
``test_sagemaker.py``, ``test_tpu.py`` (TPU pods via the peer's CLI), ``test_fp8.py``,
``test_quantization.py`` (bitsandbytes / fp8 kernels, GPU only), ``test_examples.py``
(the peer's ``examples/``, not in the sdist), ``test_multidevice.py``,
``test_activation_checkpointing_offload.py``,
``test_load_checkpoint_and_dispatch_with_broadcast.py`` (every test needs CUDA or several
GPUs), ``test_imports.py`` (the peer's own import timings), ``test_dataclasses.py``
(the peer's ``parallelism_config`` / FSDP-TP plugin dataclasses, internals).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VERSION = "1.15.0"
SDIST = ROOT / ".peer_sdist" / f"accelerate-{VERSION}.tar.gz"

FILES = (
    "test_accelerator.py", "test_big_modeling.py", "test_compile.py", "test_cpu.py",
    "test_data_loader.py", "test_grad_sync.py", "test_hooks.py", "test_kwargs_handlers.py",
    "test_logging.py", "test_memory_utils.py", "test_metrics.py", "test_modeling_utils.py",
    "test_offload.py", "test_optimizer.py", "test_scheduler.py", "test_state_checkpointing.py",
    "test_tracking.py", "test_utils.py",
)

# -- departures: deselected test ids (fnmatch patterns), each with its reason -----------------------
DEPARTURES: dict[str, str] = {}


def _depart(reason: str, *patterns: str) -> None:
    DEPARTURES.update(dict.fromkeys(patterns, reason))


SINGLETON = ("the peer's AcceleratorState/PartialState are shared-dict singletons: a reset breaks every existing "
             "state and Accelerator (AttributeError); ours belong to one Accelerator each (docs/peer_compat.md: "
             "several Accelerators never interfere), so a reset breaks nothing (AcceleratorState()/GradientState() "
             "without arguments are the latest Accelerator's, _shared_state a read-only view of it: runtime/latest.py)")
_depart(SINGLETON, "test_accelerator.py::*::test_accelerator_state_after_reset",
        "test_accelerator.py::*::test_partial_state_after_reset",
        "test_cpu.py::*::test_cpu")  # its test_script.py's test_reinstantiated_state: run_peer_script.py CHANGED
_depart("bitsandbytes 8-bit models (not installed; GPU only)",
        "test_accelerator.py::*::test_prepare_model_8bit_cpu_offload_raises_valueerror_not_typeerror")
_depart("a private helper of the peer (_refuse_recurrent_layers_under_sequence_parallelism)",
        "test_big_modeling.py::RefuseRecurrentLayersTester::*")
_depart("cpu_offload with the CPU as the execution device: the peer still moves every weight to meta and "
        "copies it back around each forward; ours leaves weights where they already run (nothing to gain)",
        "test_modeling_utils.py::*::test_align_module_device_offloaded")
_depart("our planner (big_model/planner.py) places modules by its own rule (a module that does not fit is "
        "split and its pieces fill the device; room for the largest offloaded piece kept on the main device "
        "only when something is offloaded; tied groups together): the peer's exact maps and its buffer "
        "warning differ (fallback_allocation is ours too: its no-fit, partial-fit and tied-weights tests pass)",
        "test_modeling_utils.py::*::test_infer_auto_device_map",
        "test_modeling_utils.py::*::test_infer_auto_device_map_with_buffer_check*",
        "test_modeling_utils.py::*::test_infer_auto_device_map_with_fallback_allocation",
        "test_modeling_utils.py::*::test_infer_auto_device_map_with_fallback_allocation_and_buffers",
        "test_modeling_utils.py::*::test_infer_auto_device_map_with_tied_weights")
_depart("downloads a model from the Hub (no network in tests)",
        "test_modeling_utils.py::*::test_infer_auto_device_map_on_t0pp")


def sdist() -> Path:
    """The sdist's path; ``FileNotFoundError`` saying how to get it when it is absent."""
    if not SDIST.is_file():
        raise FileNotFoundError(
            f"{SDIST} is absent: run scripts/_venv.sh, or: pip download accelerate=={VERSION} "
            f"--no-binary :all: --no-deps -d {SDIST.parent}")
    return SDIST


def extract(work: Path) -> tuple[Path, Path]:
    """The sdist's test files into ``work/tests``, its ``test_utils`` (harness and scripts) into
    ``work/harness/test_utils``."""
    tests, harness = work / "tests", work / "harness" / "test_utils"
    tests.mkdir(parents=True)
    harness.mkdir(parents=True)
    top = f"accelerate-{VERSION}"
    with tarfile.open(sdist()) as tar:
        for name in FILES:
            (tests / name).write_bytes(tar.extractfile(f"{top}/tests/{name}").read())
        prefix = f"{top}/src/accelerate/test_utils/"
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith(prefix):
                target = harness / member.name[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    return tests, harness.parent


def run(files: tuple[str, ...] = FILES, work: Path | None = None, timeout: float = 900,
        per_test_timeout: int = 60) -> dict:
    """Run ``files`` in one pytest process; returns the plugin's report plus ``returncode``/``output``."""
    work = work or Path(tempfile.mkdtemp(prefix="peer_tests_"))
    tests, harness = extract(work)
    (work / "departures.json").write_text(json.dumps(DEPARTURES))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTEBOOK_ACCEL_", "ACCELERATE_"))}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]), PEER_SHIM_HARNESS=str(harness),
               PEER_DEPARTURES=str(work / "departures.json"), PEER_REPORT=str(work / "report.json"),
               OMP_NUM_THREADS="1", WANDB_MODE="offline", MLFLOW_ALLOW_FILE_STORE="true", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HOME=str(work / "home"))
    cmd = [sys.executable, "-m", "pytest", "-p", "peer_pytest_plugin", "-p", "no:cacheprovider",
           "--rootdir", str(tests), "-c", os.devnull, "-q", "-rfE", "--continue-on-collection-errors", f"--timeout={per_test_timeout}",
           *[str(tests / f) for f in files]]
    proc = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=timeout)
    report_file = work / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {"files": {}, "failures": {}}
    return report | {"returncode": proc.returncode, "output": proc.stdout + proc.stderr, "work": str(work)}


def table(report: dict) -> str:
    """Per file: passed, failed, skipped, departures."""
    lines = [f"{'file':32} {'passed':>6} {'failed':>6} {'skipped':>7} {'departures':>10}"]
    for name, c in sorted(report["files"].items()):
        lines.append(f"{name:32} {c['passed']:>6} {c['failed']:>6} {c['skipped']:>7} {c['departures']:>10}")
    return "\n".join(lines)


def main() -> int:
    files = tuple(sys.argv[1:]) or FILES
    report = run(files)
    print(table(report))
    for test, error in report["failures"].items():
        print(f"FAILED {test}: {error}")
    if report.get("stale_departures"):
        print("departures that matched nothing:", *report["stale_departures"], sep="\n  ")
    print(f"leaked: {report.get('leaked')}; shim: {report.get('shim')}; work: {report['work']}")
    if not report["files"]:
        print(report["output"][-5000:])
    return 1 if report["failures"] or report.get("leaked") or not report["files"] else 0


if __name__ == "__main__":
    sys.exit(main())
