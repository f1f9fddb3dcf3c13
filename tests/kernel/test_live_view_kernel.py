"""The live view in a real Jupyter kernel: display messages, progress order, metric history."""

from __future__ import annotations

import pytest

# Installed in the kernel before the job: every event the kernel folds into the
# record is also written down, so the order they arrived in can be checked.
SPY = """
from notebook_accel.launch.views.record import LaunchRecord
_seen_events = []
if not hasattr(LaunchRecord, "_unspied_apply"):
    LaunchRecord._unspied_apply = LaunchRecord.apply
    def _spy_apply(self, rank, message):
        _seen_events.append((rank, message.kind, dict(getattr(message, "state", {}))))
        return LaunchRecord._unspied_apply(self, rank, message)
    LaunchRecord.apply = _spy_apply
"""

JOB = """
from notebook_accel import notebook_launcher, last_launch

def train(steps):
    import time
    from notebook_accel import events
    from notebook_accel.observe.progress import tqdm
    from notebook_accel.runtime.state import PartialState
    rank = PartialState().process_index
    for step in tqdm(range(steps), desc="train"):
        events.emit("metrics", {"step": step, "values": {"loss": 1.0 / (step + 1) + rank,
                                                         "lr": 0.1 * step}})
        if step % 10 == 0:
            print(f"at step {step}", flush=True)
        if rank == 0 and step in (14, 24):  # what torch.compile's callbacks send (runtime/compilation.py)
            events.emit("phase", {"name": "compiling" if step == 14 else None})
        time.sleep(0.1)
    return rank

notebook_launcher(train, (28,), num_processes=2)
"""


@pytest.fixture(scope="module")
def job(kernel):
    kernel.ok(SPY)
    return kernel.ok(JOB)


def _displays(result):
    return [m for m in result.outputs if m["msg_type"] in ("display_data", "update_display_data")]


def test_one_block_shown_then_updated_in_place_and_ends_as_summary(job):
    shown = _displays(job)
    assert shown and shown[0]["msg_type"] == "display_data", [m["msg_type"] for m in shown]
    ident = shown[0]["content"]["transient"]["display_id"]
    updates = shown[1:]
    assert len(updates) >= 3 and all(m["msg_type"] == "update_display_data" for m in updates)
    assert {m["content"]["transient"]["display_id"] for m in updates} == {ident}
    assert len(shown) <= 4 * 3 + 2  # redraws throttled (a ~3 s job, at most a few a second)
    for message in shown:
        assert {"text/html", "text/plain"} <= set(message["content"]["data"])
    first = shown[0]["content"]["data"]["text/plain"]
    assert "2 processes on cpu · fresh workers (fork) · mixed precision: no" in first
    assert "running" in first
    assert "rank 0: running" in first and "rank 1: running" in first
    final = shown[-1]["content"]["data"]
    assert "finished in" in final["text/plain"] and "rank 1: finished" in final["text/plain"]
    assert "train: 100%" in final["text/plain"] and "28/28" in final["text/plain"]
    assert final["text/html"].count("<img src=\"data:image/svg+xml") == 2  # loss and lr
    assert "loss: 0.03571 at step 27" in final["text/plain"]
    during = [m["content"]["data"]["text/plain"] for m in shown[1:-1]]
    assert any("rank 0: compiling (" in text and "rank 1: running" in text for text in during), during
    # the relayed output is untouched by the display
    assert "[rank 0] at step 20" in job.stdout and "[rank 1] at step 20" in job.stdout


def test_progress_events_arrive_in_order(job, kernel):
    seen = kernel.value("[(r, d['n'], d['closed']) for r, k, d in _seen_events if k == 'progress']")
    assert {rank for rank, _, _ in seen} == {0}  # main_process_only: rank 1 sends none
    counts = [n for _, n, _ in seen]
    assert counts == sorted(counts) and counts[-1] == 28 and len(counts) >= 10
    assert seen[-1][2] is True and not any(closed for _, _, closed in seen[:-1])


def test_metric_history_equals_what_rank0_logged(job, kernel):
    history = kernel.value("last_launch().history")
    assert history == {
        "loss": [(step, 1.0 / (step + 1)) for step in range(28)],
        "lr": [(step, 0.1 * step) for step in range(28)],
    }
    assert kernel.value("last_launch().outcome") == "finished"


def test_trivial_job_shows_nothing(kernel):
    result = kernel.ok("notebook_launcher(lambda: 7, num_processes=2)")
    assert _displays(result) == []
    assert result.outputs[-1]["content"]["data"]["text/plain"] == "7"


def test_failed_job_ends_as_a_static_summary_naming_the_rank(kernel):
    result = kernel.run("""
def fail():
    import os, time
    time.sleep(1.5)
    if os.environ["RANK"] == "1":
        raise ValueError("bad batch")
    time.sleep(30)

notebook_launcher(fail, num_processes=2)
""")
    assert result.error and result.error["ename"] == "WorkerError"
    shown = _displays(result)
    assert shown, "a job that ran past a second shows its status"
    final = shown[-1]["content"]["data"]["text/plain"]
    assert "failed after" in final and "rank 1: failed" in final and "rank 0: stopped" in final


@pytest.mark.slow
def test_executed_notebook_keeps_the_final_summary_in_place():
    """nbclient (as nbconvert --execute) applies the updates: one output, the summary."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("""
from notebook_accel import notebook_launcher

def train():
    import time
    from notebook_accel import events
    for step in range(15):
        events.emit("metrics", {"step": step, "values": {"loss": 1.0 / (step + 1)}})
        time.sleep(0.1)

notebook_launcher(train, num_processes=2)
""")])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    outputs = notebook.cells[0].outputs
    shown = [o for o in outputs if o.output_type == "display_data"]
    assert len(shown) == 1, [o.output_type for o in outputs]
    assert "finished in" in shown[0].data["text/plain"]
    assert "loss: 0.06667 at step 14" in shown[0].data["text/plain"]
    assert "<img src=\"data:image/svg+xml" in shown[0].data["text/html"]


def test_the_cell_magic_gets_the_same_live_view(kernel):
    kernel.ok("%load_ext notebook_accel")
    result = kernel.ok("""%%accelerate -n 2
import time
from notebook_accel.observe.progress import tqdm
for _ in tqdm(range(15), desc="magic"):
    time.sleep(0.1)
""")
    shown = _displays(result)
    assert shown and shown[0]["msg_type"] == "display_data"
    final = shown[-1]["content"]["data"]["text/plain"]
    assert "finished in" in final and "magic: 100%" in final and "15/15" in final


def test_the_header_says_a_cell_ran_on_the_warm_pool(kernel):
    kernel.ok("%load_ext notebook_accel")
    kernel.ok("%accelerate start -n 2")
    try:
        result = kernel.ok("%%accelerate\nimport time\ntime.sleep(1.5)")
    finally:
        kernel.ok("%accelerate stop")
    final = _displays(result)[-1]["content"]["data"]
    assert "2 processes on cpu · on the warm pool (fork) · mixed precision: no" in final["text/plain"]
    assert "on the warm pool (fork)" in final["text/html"] and "finished in" in final["text/plain"]


def test_the_finished_table_shows_each_ranks_real_last_line(kernel):
    """The summary's rows take in the lines read in the run's last wakeups (a rank's last
    line arrives with its end: unflushed until the run ends)."""
    kernel.ok("%load_ext notebook_accel")
    kernel.ok("%accelerate start -n 2")
    try:
        for _ in range(3):
            result = kernel.ok("""%%accelerate
import time
for step in range(0, 500, 20):
    time.sleep(0.05)
    print(f"step {step}", flush=True)
print("done after step 480")
""")
            assert "[rank 1] done after step 480" in result.stdout
            rows = [line for line in _displays(result)[-1]["content"]["data"]["text/plain"]
                    .splitlines() if line.lstrip().startswith("rank ")]
            assert len(rows) == 2 and all(row.endswith("| done after step 480") for row in rows), rows
    finally:
        kernel.ok("%accelerate stop")
