"""The plain-text fallback: a launch from a plain script prints status lines, not HTML."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import sys, time
    from notebook_accel import notebook_launcher

    def train():
        import os, time
        from notebook_accel import events
        for step in range(12):
            events.emit("metrics", {"step": step, "values": {"loss": 0.5}})
            time.sleep(0.1)
        if os.environ["RANK"] == "0":
            time.sleep(1.0)  # rank 1 finishes first: a state change
        return 1

    notebook_launcher(train, num_processes=2)
    print("=== trivial", file=sys.stderr, flush=True)
    notebook_launcher(lambda: 2, num_processes=2)
    print("=== end", file=sys.stderr, flush=True)
""")


@pytest.mark.slow
def test_a_script_gets_status_lines_and_a_summary_and_nothing_for_a_trivial_job(tmp_path: Path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTEBOOK_ACCEL_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, _, rest = done.stderr.partition("=== trivial")
    trivial, _, _ = rest.partition("=== end")
    lines = [line for line in first.splitlines() if line.startswith("[notebook_accel] ")]
    assert lines, done.stderr
    assert lines[0] == "[notebook_accel] starting 2 workers (fork)..."  # cold: said first
    assert any(": 2 running" in line and "loss 0.5 @ step" in line for line in lines), lines
    assert any("1 running, 1 finished" in line for line in lines), lines
    assert lines[-1].startswith("[notebook_accel] finished in ") and "2 finished" in lines[-1]
    assert "| fresh workers (fork) |" in lines[-1]
    assert "<" not in first  # plain text, no HTML
    assert "[notebook_accel]" not in trivial
    assert "finished in" not in done.stdout  # status lines stay off stdout
