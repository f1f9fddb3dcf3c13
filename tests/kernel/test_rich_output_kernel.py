"""Rich output of workers in a real kernel: shown in the cell, never sent by a worker itself.

Every iopub message of the launch is captured (not only the cell's): a message
whose id carries another pid than the kernel's was written by a worker onto the
kernel's socket.
"""

from __future__ import annotations

import queue
import time

import pytest

from tests.kernel_harness import Kernel, wait_no_workers

SETUP = """
%matplotlib inline
from notebook_accel import notebook_launcher
from tqdm.auto import tqdm                 # as Hugging Face examples do, in the notebook
from IPython.display import display, HTML
import ipywidgets

def job():
    import os, time
    import matplotlib.pyplot as plt
    rank = int(os.environ["RANK"])
    print("before", rank, flush=True)
    display(HTML(f"<b>rich from rank {rank}</b>"))
    display(ipywidgets.IntSlider(value=3))          # a widget no frontend could reach
    for _ in tqdm(range(12), desc="steps", disable=rank != 0):
        time.sleep(0.1)
    if rank == 0:
        plt.plot([0, 1, 4])
        plt.show()
    print("after", rank, flush=True)
    return rank
"""


@pytest.fixture(scope="module")
def kernel(module_config_dirs):
    k = Kernel()
    k.ok(SETUP)
    yield k
    k.shutdown()


def every_iopub_message(k: Kernel, msg_id: str, timeout: float = 120) -> list[dict]:
    """All iopub traffic until the cell ``msg_id`` is idle, whoever sent it."""
    messages, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = k.client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        messages.append(msg)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            return messages
    raise TimeoutError(messages)


def sender_pid(msg: dict) -> int:
    return int(msg["header"]["msg_id"].rsplit("_", 2)[-2])


def test_sender_pid_is_read_from_message_ids(kernel):
    msgs = every_iopub_message(kernel, kernel.execute("print(1)"))
    assert {sender_pid(m) for m in msgs} == {kernel.pid}


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow),
                                    pytest.param("forkserver", marks=pytest.mark.slow)])
def test_rich_output_of_rank_zero_reaches_the_cell_and_no_worker_touches_a_socket(kernel, method):
    msg_id = kernel.execute(f"print('result', notebook_launcher(job, num_processes=2, "
                            f"start_method={method!r}))")
    msgs = every_iopub_message(kernel, msg_id)
    assert {sender_pid(m) for m in msgs} == {kernel.pid}, sorted({sender_pid(m) for m in msgs})
    assert not [m for m in msgs if m["msg_type"].startswith("comm")]
    mine = [m for m in msgs if m["parent_header"].get("msg_id") == msg_id]
    displays = [m["content"]["data"] for m in mine if m["msg_type"] == "display_data"]
    html = [d["text/html"] for d in displays if "rich from" in d.get("text/html", "")]
    assert html == ["<b>rich from rank 0</b>"]
    assert any("image/png" in d for d in displays), [list(d) for d in displays]
    assert not any("application/vnd.jupyter.widget-view+json" in d for d in displays)
    text = "".join(m["content"]["text"] for m in mine if m["msg_type"] == "stream")
    assert "object>" not in text  # other ranks: a useful text form, or counted
    assert "[rank 1] IntSlider(value=3" in text
    assert "result 0" in text and "[rank 0] after 0" in text
    order = [("text" if m["msg_type"] == "stream" else "rich") for m in mine
             if m["msg_type"] == "stream" and "[rank 0]" in m["content"]["text"]
             or m["msg_type"] == "display_data" and "rich from" in str(m["content"]["data"])]
    assert order.index("rich") > 0  # "before 0" printed first, shown first
    live = [m["content"]["data"]["text/html"] for m in mine
            if m["msg_type"] in ("display_data", "update_display_data")
            and "notebook-accel-live" in m["content"]["data"].get("text/html", "")]
    assert any("steps" in block for block in live)  # tqdm.auto became the job's bar
    assert "rank 1 displayed 1 rich output (shown for rank 0, in a notebook)" in live[-1]
    assert not wait_no_workers(timeout=5)


def test_the_live_block_sits_above_the_log_from_the_first_line(kernel):
    msg_id = kernel.execute("def chatty():\n    import time\n"
                            "    for i in range(15):\n        print('line', i, flush=True)\n"
                            "        time.sleep(0.1)\n"
                            "notebook_launcher(chatty, num_processes=2)")
    mine = [m for m in every_iopub_message(kernel, msg_id)
            if m["parent_header"].get("msg_id") == msg_id
            and m["msg_type"] in ("stream", "display_data")]
    kinds = [m["msg_type"] for m in mine]
    assert kinds[0] == "display_data" and "stream" in kinds, kinds
    assert "notebook-accel-live" in mine[0]["content"]["data"]["text/html"]
    assert "[rank 0] line 0" in "".join(m["content"].get("text", "") for m in mine)


def test_a_cell_magic_shows_the_figures_it_leaves_open_once_from_rank_zero(kernel):
    kernel.ok("%load_ext notebook_accel")
    result = kernel.ok("%%accelerate -n 2\nimport matplotlib.pyplot as plt\n"
                       "plt.plot([1, 2, 3])\nplt.title('left open')")
    images = [m for m in result.outputs if m["msg_type"] == "display_data"
              and "image/png" in m["content"]["data"]]
    assert len(images) == 1, [m["content"]["data"].keys() for m in result.outputs]
    assert not wait_no_workers(timeout=5)
