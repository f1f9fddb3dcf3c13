"""The notebook front end on Colab's stack: a real kernel in .venv-colab (scripts/_venv_colab.sh:
IPython 7.34, ipykernel 6.17.1, jupyter_client 7.4.9, ipywidgets 7.7.1) runs the magics, the
launcher, a warm pool, the panel and the live view, and a failing rank says ``Cell In[N]``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.kernel_harness import Kernel, wait_no_workers
from tests.platforms.resolve import ROOT, load

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the kernel's pool outlives a test: conftest checks for leaks per module
PYTHON = Path(os.environ.get("COLAB_VENV", ROOT / ".venv-colab")) / "bin" / "python"
WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def k():
    """A kernel of Colab's stack whose cells are numbered as in a notebook."""
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: scripts/test_platforms.sh makes it")
    kernel = Kernel(history=True, python=str(PYTHON))
    kernel.count = 1  # the harness's own first cell
    yield kernel
    kernel.shutdown()


def run(k, code: str, ok: bool = True):
    """Run a cell (``k.count`` is its ``In[N]``). A failing one is sent without
    ``stop_on_error``: ipykernel 6.17 would abort the next cell if it came at once."""
    k.count += 1
    if ok:
        return k.ok(code, timeout=180)
    return k.collect(k.client.execute(code, store_history=True, stop_on_error=False), timeout=180)


def test_the_kernel_has_colabs_pins(k):
    versions = run(k, "import IPython, ipykernel, ipywidgets, jupyter_client, sys, torch\n"
                      "print(IPython.__version__, ipykernel.__version__, ipywidgets.__version__,"
                      " jupyter_client.__version__, sys.prefix)").stdout.split()
    assert versions[:4] == [pin for name in ("ipython", "ipykernel", "ipywidgets", "jupyter-client")
                            for pin in [load("colab_gpu").pins[name]]]
    assert Path(versions[4]) == PYTHON.parent.parent.absolute()


def test_the_extension_loads_both_ways(k):
    run(k, "%load_ext notebook_accel")  # README's
    run(k, "%load_ext magics")  # the front end's own name: loading twice is harmless
    assert "no pool is up" in run(k, "%accelerate status").stdout


def test_notebook_launcher_runs_a_gloo_job(k):
    run(k, "from notebook_accel import notebook_launcher\n"
           "def job(scale):\n"
           "    import torch, torch.distributed as dist\n"
           "    dist.init_process_group('gloo')\n"
           "    t = torch.tensor([scale * (dist.get_rank() + 1)])\n"
           "    dist.all_reduce(t)\n"
           "    print('sum', t.item())\n"
           "    return t.item()\n")
    result = run(k, "total = notebook_launcher(job, (0.5,), num_processes=2)\nprint('got', total)")
    assert "[rank 0] sum 1.5" in result.stdout and "[rank 1] sum 1.5" in result.stdout
    assert "got 1.5" in result.stdout
    assert not wait_no_workers(timeout=5)


def test_a_cell_runs_on_every_rank(k):
    result = run(k, "%%accelerate -n 2\nimport os\nprint('hello from', os.environ['RANK'])")
    assert "[rank 0] hello from 0" in result.stdout and "[rank 1] hello from 1" in result.stdout


def test_a_failing_rank_says_which_cell_and_line(k):
    run(k, "def check(rank):\n    if rank == 1:\n        raise ValueError('rank 1 is bad')\n")
    defined = k.count
    result = run(k, "%%accelerate -n 2\nimport os\nx = 1\ncheck(int(os.environ['RANK']))", ok=False)
    text = result.traceback
    assert result.error["ename"] == "WorkerError", text
    assert f"Cell In[{k.count}], line 4, in <module>" in text, text
    assert f"Cell In[{defined}], line 3, in check" in text, text
    assert "ipykernel_" not in text and "ipython-input" not in text, text
    # A forkserver's workers do not inherit the kernel's linecache: the cells' sources travel.
    result = run(k, "notebook_launcher(lambda: check(1), num_processes=1, start_method='forkserver')",
                 ok=False)
    text = result.traceback
    assert f"Cell In[{k.count}], line 1, in <lambda>" in text, text
    assert f"Cell In[{defined}], line 3, in check\n    raise ValueError('rank 1 is bad')" in text, text


def test_kernel_side_errors_show_the_users_line_only(k):
    text = run(k, "notebook_launcher(check, num_processes=0)", ok=False).traceback
    assert "num_processes=0 must be an int >= 1" in text
    assert "notebook_accel/" not in text and "magics/" not in text, text
    text = run(k, "%%accelerate -n 2\nx = (", ok=False).traceback
    assert text.splitlines()[0].strip() == f"Cell In[{k.count}], line 2", text


def test_a_warm_pool_keeps_state_across_cells(k):
    assert "pool up: 2 ranks on cpu" in run(k, "%accelerate start -n 2").stdout
    run(k, "%%accelerate\nimport os\nsteps = int(os.environ['RANK']) * 10")
    again = run(k, "%%accelerate\nsteps += 1\nprint('steps', steps)")
    assert "[rank 0] steps 1" in again.stdout and "[rank 1] steps 11" in again.stdout
    run(k, "%accelerate stop")
    assert not wait_no_workers(timeout=10)


def test_the_panel_shows_with_its_tooltips(k):
    """ipywidgets 7.7.1 takes a field's tooltip as ``description_tooltip`` only: given as
    ``tooltip`` it is dropped, with a DeprecationWarning (hidden unless shown always)."""
    result = run(k, "import warnings\nwith warnings.catch_warnings():\n"
                    "    warnings.simplefilter('always')\n"
                    "    panel = get_ipython().run_line_magic('accelerate', 'config')\npanel")
    assert any(WIDGET in m["content"].get("data", {}) for m in result.outputs), result
    assert "unrecognized arguments" not in result.stderr, result.stderr


def test_the_live_view_draws_and_updates(k):
    run(k, "def slow():\n    import time\n    for i in range(4):\n"
           "        print('step', i, flush=True)\n        time.sleep(0.5)\n")
    result = run(k, "notebook_launcher(slow, num_processes=2)")
    shown = [m for m in result.outputs if m["msg_type"] in ("display_data", "update_display_data")]
    assert shown and shown[0]["msg_type"] == "display_data", result.outputs
    final = shown[-1]["content"]["data"]
    assert "2 processes on cpu" in final["text/plain"] and "finished in" in final["text/plain"]
    assert "[rank 1] step 3" in result.stdout
