"""Reproduction: torch's DataLoader (4 workers per rank, 2 ranks on gloo) now and then waits
forever for one worker's batch, with Hugging Face Accelerate itself as with notebook_accel.

It takes the DataLoader tests of the installed accelerate's own
``test_utils/scripts/test_distributed_data_loop.py`` (its ``main`` cut down to them, in a temporary
copy), adds a watchdog that prints every DataLoader iterator's bookkeeping after 30 s, and runs it
``--runs`` times under ``torchrun --nproc-per-node 2``, killing a run after 45 s::

    python docs/repro/dataloader_lost_batch.py --who peer --runs 150   # the real accelerate
    python docs/repro/dataloader_lost_batch.py --who ours --runs 150   # notebook_accel (tests/peer_shim)

Measured on a 2-core machine: peer 2 hangs in 200 runs, ours 3 in 350. A hung run looks
the same with either: each rank's iterator has sent 3 tasks and received all but one
(``outstanding 1``); the worker that got the missing task is alive, idle, and has already
pickled its result (its resource-sharer thread is up). See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WATCHDOG = '''
def _watchdog():
    import gc, threading, time
    def run():
        time.sleep(30)
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
        for it in [o for o in gc.get_objects() if isinstance(o, _MultiProcessingDataLoaderIter)]:
            print("WATCHDOG rank", os.environ.get("RANK"), "received", it._rcvd_idx, "sent", it._send_idx,
                  "outstanding", it._tasks_outstanding, "waiting for", sorted(k for k, v in it._task_info.items()
                  if len(v) == 1), flush=True, file=sys.stderr)
    threading.Thread(target=run, daemon=True).start()


'''


def trimmed_script(dest: Path) -> Path:
    """The peer's script with ``main`` keeping only its DataLoader tests, plus the watchdog."""
    from importlib.util import find_spec

    spec = find_spec("accelerate")
    if spec is None or spec.origin is None:
        sys.exit("accelerate is not installed (pip install accelerate==1.15.0)")
    source = (Path(spec.origin).parent / "test_utils" / "scripts" / "test_distributed_data_loop.py").read_text()
    start = source.index("def main():")
    body = source.index("    dataset = DummyDataset()", start)
    head = ("def main():\n    _watchdog()\n    accelerator = create_accelerator()\n"
            "    torch.manual_seed(accelerator.process_index)\n")
    text = source[:start] + WATCHDOG + head + source[body:]
    text = text.replace("    test_stateful_dataloader(accelerator)\n", "")
    text = text.replace("    test_stateful_dataloader_save_state(accelerator)\n", "")
    if "import os\n" not in text:
        text = "import os\nimport sys\n" + text
    path = dest / "dataloader_loop.py"
    path.write_text(text)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--who", choices=("peer", "ours"), default="peer")
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "NOTEBOOK_ACCEL_"))}
    env["OMP_NUM_THREADS"] = "1"
    if args.who == "peer":
        env["ACCELERATE_USE_CPU"] = "true"
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "peer_shim"), str(ROOT)])
    hangs = 0
    with tempfile.TemporaryDirectory() as tmp:
        script = trimmed_script(Path(tmp))
        for i in range(args.runs):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)]
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            try:
                output, _ = proc.communicate(timeout=45)
            except subprocess.TimeoutExpired:
                import psutil

                for child in psutil.Process(proc.pid).children(recursive=True):  # workers: own sessions
                    child.kill()
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
                hangs += 1
                print(f"run {i}: hung", *[line for line in output.splitlines() if "WATCHDOG" in line], sep="\n  ")
            time.sleep(0.1)
    print(f"{args.who}: {hangs} hang(s) in {args.runs} runs")


if __name__ == "__main__":
    main()
