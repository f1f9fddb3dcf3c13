"""Today's TPUs, with a real process holding the TPU's lock file (tests/unit/test_tpu_platforms.py has the rest)."""

from __future__ import annotations

import subprocess
import sys
import time

from notebook_accel.machine import tpu_holders


def test_a_live_process_holding_the_lock_file_is_named(tmp_path):
    lock = tmp_path / "libtpu_lockfile"
    lock.touch()
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(lock)!r}); import time; "
                               "print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        found = tpu_holders.tpu_holders(lockfile=str(lock))
        assert holder.pid in found and found[holder.pid].startswith(f"{sys.executable} -c")
        message = tpu_holders.tpu_held_message(modules={}, holders=found)
        assert f"held by another process: pid {holder.pid} (" in message
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 5
    while holder.pid in tpu_holders.tpu_holders(lockfile=str(lock)) and time.monotonic() < deadline:
        time.sleep(0.05)  # pragma: no cover - /proc may lag a moment
    assert holder.pid not in tpu_holders.tpu_holders(lockfile=str(lock))  # a stale file holds nothing
