"""Errors in a real kernel read like IPython's own: the user's frames, once, with cell labels.

Cells run with ``store_history=True``, as in a notebook, so ``Cell In[N]`` numbers
are the ones the notebook shows.
"""

from __future__ import annotations

import re

import pytest

from tests.kernel_harness import Kernel, wait_no_workers


class NotebookKernel:
    """A kernel whose cells are numbered as in a notebook."""

    def __init__(self) -> None:
        self.kernel = Kernel()
        self.count = 0

    def run(self, code: str):
        self.count += 1
        result = self.kernel.collect(self.kernel.client.execute(code, store_history=True))
        return result, self.count


@pytest.fixture(scope="module")
def nb(module_config_dirs):
    k = NotebookKernel()
    k.run("%load_ext notebook_accel\nfrom notebook_accel import notebook_launcher")
    k.run("def check(v):\n    if v:\n        raise ValueError(f'bad {v}')\n"
          "def job():\n    import os\n    check(int(os.environ['RANK']))\n")
    yield k
    k.kernel.shutdown()


OURS = re.compile(r"notebook_accel/|magics/|multiprocessing|ipykernel|IPython/core")


def test_worker_frames_are_labelled_as_cells_without_internal_frames(nb):
    result, n = nb.run("notebook_launcher(job, num_processes=2)")
    text = result.traceback
    assert result.error["ename"] == "WorkerError"
    assert "Cell In[2], line 6, in job" in text and "Cell In[2], line 3, in check" in text
    assert "ipykernel_" not in text and not OURS.search(text), text
    result, n = nb.run("%%accelerate -n 2\nimport os\nx = 1\ncheck(int(os.environ['RANK']))")
    text = result.traceback
    assert f"Cell In[{n}], line 4, in <module>" in text, text
    assert "line 1, in <module>" not in text and "%%accelerate" not in text  # no bogus frame
    assert not OURS.search(text)
    assert not wait_no_workers(timeout=5)


def test_kernel_side_errors_carry_the_cells_own_number(nb):
    result, n = nb.run("%%accelerate -n 2\nx = (")
    assert result.error["ename"] == "CellSyntaxError"
    assert result.traceback.splitlines()[0].strip() == f"Cell In[{n}], line 2"


def test_launcher_value_errors_show_only_the_users_line(nb):
    result, n = nb.run("notebook_launcher(job, num_processes=0)")
    text = result.traceback
    assert result.error["ename"] == "ValueError"
    assert f"Cell In[{n}], line 1" in text and "num_processes=0 must be an int >= 1" in text
    assert not OURS.search(text), text


def test_a_timeout_shows_each_stack_once_and_consistent_facts(nb):
    nb.run("def hang():\n    import time\n    print('going to sleep', flush=True)\n"
           "    time.sleep(100)\n")
    result, n = nb.run("notebook_launcher(hang, num_processes=2, timeout=2)")
    text = result.traceback
    assert result.error["ename"] == "WorkerError"
    assert re.search(r"timed out after 2\.\d s \(timeout=2 s\): ranks 0, 1 stopped", text), text
    assert text.count("time.sleep(100)") == 1 and f"Cell In[{n - 1}], line 4, in hang" in text
    assert "still running" not in text.replace("stopped while still running", "")
    assert not OURS.search(text) and "Thread 0x" not in text, text
    assert "Thread 0x" not in result.stderr and "time.sleep" not in result.stderr  # not relayed
    status = [m["content"]["data"]["text/plain"] for m in result.outputs
              if "text/plain" in m["content"].get("data", {})]
    seconds = re.search(r"timed out after (\d\.\d) s", text)[1]
    assert f"timed out after {seconds} s" in status[-1], status[-1]  # the live view agrees
    assert "<string>" not in status[-1]


def test_undefined_names_are_refused_before_any_worker_starts(nb, tmp_path):
    nb.run("learning_rate = 0.1")
    marker = tmp_path / "started"
    result, _ = nb.run(f"%%accelerate -n 2\nopen({str(marker)!r}, 'w').close()\n"
                       "for i in range(2):\n    last = i\nprint(last, learning_rat, epochs)")
    assert result.error["ename"] == "UndefinedNamesError"
    assert result.traceback == ("NameError: names 'learning_rat' (did you mean 'learning_rate'?), "
                                "'epochs' are not defined: the cell reads them, but neither the "
                                "notebook nor the cell defines them; no worker was started")
    assert not marker.exists() and "[rank" not in result.stdout
    result, _ = nb.run("%%accelerate -n 2\nfor i in range(2):\n    last = i\nprint(last)")
    assert result.error is None, result.traceback  # bound on some path only: let through


def test_launcher_warns_about_globals_that_do_not_exist(nb):
    nb.run("def typo():\n    return lerning_rate * 2\n")
    result, _ = nb.run("notebook_launcher(typo, num_processes=2)")
    assert ("[notebook_accel] warning: typo reads 'lerning_rate', not defined in its module or "
            "the notebook") in result.stderr
    result, _ = nb.run("notebook_launcher(job, num_processes=1)")
    assert "warning" not in result.stderr


FLAG_CASES = [
    ("%%accelerate --mixed-precison bf16\nx = 1", "unknown flag --mixed-precison (did you mean "
                                                  "--mixed-precision?)"),
    ("%%accelerate --nproc 2\nx = 1", "unknown flag --nproc (did you mean --num-processes?)"),
    ("%%accelerate --mixed_precision bf16\nx = 1", "did you mean --mixed-precision?"),
    ("%%accelerate -n 2 extra\nx = 1", "unexpected 'extra': the cell magic takes only flags"),
    ("%accelerate tset", "unknown command 'tset' (did you mean test?)"),
    ("%accelerate env extra", "unexpected 'extra'"),
]


@pytest.mark.parametrize("code, message", FLAG_CASES)
def test_flag_errors_name_the_bad_word_and_suggest_the_closest(nb, code, message):
    result, _ = nb.run(code)
    assert message in result.stderr, result.stderr
    assert "invalid choice" not in result.stderr and "[rank" not in result.stdout


def test_failed_job_marks_the_root_cause_and_workers_are_named_in_ps(nb):
    nb.run("def slow_fail():\n    import os, time, setproctitle\n"
           "    print('title', setproctitle.getproctitle(), flush=True)\n"
           "    time.sleep(1.5)\n    if os.environ['RANK'] == '1':\n"
           "        raise RuntimeError('boom')\n    time.sleep(30)\n")
    result, _ = nb.run("notebook_launcher(slow_fail, num_processes=2)")
    assert "[rank 0] title notebook_accel rank 0 of 2" in result.stdout
    assert "[rank 1] title notebook_accel rank 1 of 2" in result.stdout
    final = [m["content"]["data"] for m in result.outputs
             if "notebook-accel-live" in m["content"]["data"].get("text/html", "")][-1]
    assert "rank 1: failed (exit 1) · root cause" in final["text/plain"], final["text/plain"]
    assert "rank 0: stopped" in final["text/plain"] and final["text/plain"].count("root cause") == 1
    assert "<code></code>" not in final["text/html"]


def test_the_config_file_in_force_is_named_and_env_reports_what_a_launch_does(nb, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("num_processes: 2\nmixed_precision: bf16\n")
    result, _ = nb.run(f"print(notebook_launcher(lambda: 5, config_file={str(config)!r}))")
    assert result.stdout.splitlines()[0] == (
        f"[notebook_accel] config file {config}: num_processes=2, mixed_precision='bf16'")
    result, _ = nb.run(f"notebook_launcher(lambda: 5, num_processes=1, mixed_precision='no', "
                       f"config_file={str(config)!r})")
    assert "config file" not in result.stdout  # nothing came from it
    result, _ = nb.run(f"%accelerate env --config {config}")
    assert ("A launch here: 2 process(es) on cpu (distributed_type MULTI_CPU, use_cpu true), "
            "start method fork, mixed precision bf16") in result.stdout, result.stdout
