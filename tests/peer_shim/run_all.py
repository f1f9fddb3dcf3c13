"""Run the peer's test scripts (from the installed ``accelerate`` wheel) against notebook_accel; print the counts.

Usage: ``python tests/peer_shim/run_all.py [OUT_DIR]``. Each of ``test_script.py``,
``test_ops.py``, ``test_sync.py`` and ``test_distributed_data_loop.py`` runs under
``torchrun --nproc-per-node 2`` and through our ``notebook_launcher`` (2 workers); ``test_notebook.py`` launches its own 2 workers
(``ACCELERATE_NUM_PROCESSES=2``); ``test_sync.py`` runs once more on 1 process, for
its one-process check. Only the shim ``accelerate`` package (this
directory) is importable as ``accelerate``; the real one is never imported.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from notebook_accel.launch.handoff.ports import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RUNNER = HERE / "run_peer_script.py"
TORCHRUN_SCRIPTS = ("test_script.py", "test_ops.py", "test_sync.py", "test_distributed_data_loop.py")
SCRIPTS = (*TORCHRUN_SCRIPTS, "test_notebook.py")


def peer_scripts_dir() -> Path:
    """``accelerate/test_utils/scripts`` of the installed wheel, found without importing it."""
    paths = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # not the shim
    spec = importlib.machinery.PathFinder.find_spec("accelerate", paths)
    if spec is None or spec.origin is None:
        raise FileNotFoundError("accelerate is not installed (pip install -e '.[bench]')")
    return Path(spec.origin).parent / "test_utils" / "scripts"


def copy_scripts(dest: Path) -> None:
    """Copy the peer's scripts into ``dest`` (unchanged)."""
    for name in SCRIPTS:
        shutil.copy(peer_scripts_dir() / name, dest / name)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NOTEBOOK_ACCEL_", "ACCELERATE_", "PET_", "TORCHELASTIC_"))}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # torchrun starts its workers in sessions of their own: kill every descendant, or they
        # keep the output pipe open and the wait below never ends
        import psutil

        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return -9, output + f"\n[timed out after {timeout} s]"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole session: launcher and workers
        except ProcessLookupError:
            pass
    return proc.returncode, output


def run_script(script: str, work: Path, mode: str = "torchrun", timeout: float = 240, nproc: int = 2) -> dict:
    """Run one script in ``work/<mode>`` (``torchrun`` on ``nproc``, ``launcher`` or ``notebook``); returns its reports.

    Returns ``{"returncode", "output", "ranks": [report of rank 0, rank 1]}``.
    """
    out = work / f"{mode}{'' if nproc == 2 else nproc}_{Path(script).stem}"
    out.mkdir(parents=True, exist_ok=True)
    target = str(work / script)
    if mode == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
               "127.0.0.1", "--master-port", str(free_port()), str(RUNNER), target, str(out)]
        env = _env()
    elif mode == "launcher":
        cmd, env = [sys.executable, str(RUNNER), "--launcher", target, str(out)], _env()
    else:  # the script starts its own workers through notebook_launcher
        cmd, env = [sys.executable, str(RUNNER), target, str(out)], _env(ACCELERATE_NUM_PROCESSES="2")
    code, output = _run(cmd, out, env, timeout)
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("*_rank*.json"))]
    return {"returncode": code, "output": output, "ranks": ranks}


def counts(result: dict) -> dict:
    """Per-script counts from rank 0's report (every rank runs the same checks)."""
    report = result["ranks"][0]
    return {k: len(report[k]) for k in ("passed", "failed", "skipped", "changed")} | {"calls": report["calls"]}


def run_all(work: Path) -> dict[str, dict]:
    copy_scripts(work)
    results = {f"{s} (torchrun)": run_script(s, work) for s in TORCHRUN_SCRIPTS}
    results |= {f"{s} (notebook_launcher)": run_script(s, work, "launcher") for s in TORCHRUN_SCRIPTS}
    results["test_notebook.py (its own notebook_launcher)"] = run_script("test_notebook.py", work, "notebook")
    results["test_sync.py (torchrun, 1 process)"] = run_script("test_sync.py", work, nproc=1)
    return results


def main() -> int:
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="peer_scripts_"))
    work.mkdir(parents=True, exist_ok=True)
    results = run_all(work)
    print(f"{'script':48} {'passed':>6} {'failed':>6} {'skipped':>7} {'changed':>7}  skipped checks")
    bad = False
    for name, result in results.items():
        if not result["ranks"] or result["returncode"] != 0:
            print(f"{name:48} did not finish (exit {result['returncode']}):\n{result['output'][-3000:]}")
            bad = True
            continue
        c, report = counts(result), result["ranks"][0]
        bad |= bool(c["failed"]) or any(r["leaked"] for r in result["ranks"])
        print(f"{name:48} {c['passed']:>6} {c['failed']:>6} {c['skipped']:>7} {c['changed']:>7}  "
              f"{', '.join(report['skipped']) or '-'}")
    print(f"(reports in {work})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
