"""A real Jupyter kernel for tests, driven through jupyter_client."""

from __future__ import annotations

import os
import queue
import shutil
import sys
import time
from dataclasses import dataclass, field

import psutil
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

WORKER_NAME_PREFIX = "nbaccel-r"
# Kernels started by this test session carry this marker in their environment, and so
# do their workers: other sessions' workers on the same machine are left alone.
SESSION_MARKER = "NBACCEL_TEST_SESSION"  # not NOTEBOOK_ACCEL_*: the config isolation unsets those
os.environ.setdefault(SESSION_MARKER, f"{os.getpid()}-{time.time_ns()}")


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    error: dict | None = None  # ename, evalue, traceback (ANSI stripped)
    outputs: list[dict] = field(default_factory=list)
    elapsed: float = 0.0  # seconds from the execute request to the kernel's idle
    first_output: float | None = None  # seconds from the request to its first output message
    first_message: dict | None = None  # that message

    @property
    def traceback(self) -> str:
        return "\n".join(self.error["traceback"]) if self.error else ""


_OUTPUT_KINDS = ("stream", "display_data", "update_display_data", "execute_result", "error")


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _kernel_manager(python: str | None) -> KernelManager:
    """A manager for this interpreter's kernel, or ``python``'s (a kernel spec of its own)."""
    if python is None:
        return KernelManager(kernel_name="python3")
    import json
    import tempfile

    specs = tempfile.mkdtemp(prefix="nbaccel-kernelspec-")
    os.makedirs(os.path.join(specs, "other"))
    with open(os.path.join(specs, "other", "kernel.json"), "w") as spec:
        json.dump({"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": python, "language": "python"}, spec)
    manager = KernelManager(kernel_name="other",
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[specs]))
    manager.kernel_spec  # read now, so the folder can go  # noqa: B018
    shutil.rmtree(specs)
    return manager


class Kernel:
    """One IPython kernel running the test interpreter (so it sees this checkout)."""

    def __init__(self, extra_env: dict[str, str] | None = None, history: bool = False,
                 python: str | None = None) -> None:
        """``history``: cells are numbered as in a notebook (``In [N]``), not all alike.
        ``python``: the kernel's interpreter (another venv's), else the test interpreter."""
        self.history = history
        self.manager = _kernel_manager(python)
        env = dict(os.environ)
        env.pop("PYTEST_CURRENT_TEST", None)
        env.update(extra_env or {})
        self.manager.start_kernel(
            env=env, extra_arguments=["--HistoryManager.enabled=False"]
        )
        self.client = self.manager.client()
        self.sent: dict[str, float] = {}  # msg_id -> when its execute request was sent
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        result = self.run("import sys, os; print(sys.executable, os.getpid())")
        executable, pid = result.stdout.split()
        assert os.path.realpath(executable) == os.path.realpath(python or sys.executable), executable
        self.pid = int(pid)

    def execute(self, code: str) -> str:
        sent = time.monotonic()
        msg_id = self.client.execute(code, store_history=self.history)
        self.sent[msg_id] = sent
        return msg_id

    def collect(self, msg_id: str, timeout: float = 120.0, on_output=None,
                on_input=None) -> CellResult:
        """Gather the outputs of one execution until the kernel is idle again.

        ``on_input(prompt, result)``: answers the kernel's input requests (Jupyter's stdin
        channel, as a notebook's input box); returns the line to send, or None to send none.
        """
        result = CellResult()
        start = self.sent.pop(msg_id, time.monotonic())
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"cell did not finish in {timeout} s; so far: {result}")
            if on_input is not None:
                try:
                    request = self.client.get_stdin_msg(timeout=0.01)
                except queue.Empty:
                    request = None
                if request is not None and request["msg_type"] == "input_request":
                    line = on_input(request["content"]["prompt"], result)
                    if line is not None:
                        self.client.input(line)
            try:
                msg = self.client.get_iopub_msg(timeout=min(remaining, 0.05 if on_input else 1.0))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if result.first_output is None and kind in _OUTPUT_KINDS:
                result.first_output, result.first_message = time.monotonic() - start, msg
            if kind == "stream":
                if content["name"] == "stdout":
                    result.stdout += content["text"]
                else:
                    result.stderr += content["text"]
                if on_output is not None:
                    on_output(result)
            elif kind == "error":
                result.error = {
                    "ename": content["ename"],
                    "evalue": content["evalue"],
                    "traceback": [_strip_ansi(line) for line in content["traceback"]],
                }
            elif kind in ("display_data", "update_display_data", "execute_result"):
                result.outputs.append(msg)
            elif kind == "status" and content["execution_state"] == "idle":
                break
        result.elapsed = time.monotonic() - start
        return result

    def run(self, code: str, timeout: float = 120.0) -> CellResult:
        return self.collect(self.execute(code), timeout)

    def ok(self, code: str, timeout: float = 120.0) -> CellResult:
        """Run a cell that must succeed."""
        result = self.run(code, timeout)
        assert result.error is None, result.traceback + "\n" + result.stderr
        return result

    def value(self, expression: str):
        """Evaluate ``expression`` in the kernel and return it (via repr / literal_eval)."""
        import ast

        result = self.ok(f"print(repr({expression}))")
        return ast.literal_eval(result.stdout.strip().splitlines()[-1])

    def shutdown(self) -> None:
        try:
            self.client.stop_channels()
            self.manager.shutdown_kernel(now=True)
        except Exception:  # noqa: BLE001 - best effort in teardown
            pass


def _ours(proc: psutil.Process, me: int) -> bool:
    """Started by this test session: a descendant of it, or marked by a kernel it started."""
    try:
        if proc.environ().get(SESSION_MARKER) == os.environ[SESSION_MARKER]:
            return True
        return any(parent.pid == me for parent in proc.parents())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def worker_processes() -> list[psutil.Process]:
    """Every worker process (or child of one) that this test session started."""
    found, me = [], os.getpid()
    for proc in psutil.process_iter(["name", "status"]):
        try:
            if (
                (proc.info["name"] or "").startswith(WORKER_NAME_PREFIX)
                and proc.info["status"] != psutil.STATUS_ZOMBIE
                and _ours(proc, me)
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_no_workers(timeout: float = 5.0) -> list[psutil.Process]:
    """Wait until no worker process is left; returns the ones still there."""
    deadline = time.monotonic() + timeout
    while True:
        left = worker_processes()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
