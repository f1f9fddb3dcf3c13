"""Shared by the real-browser tests: JupyterLab on a random port, headless Chromium.

Needs ``apt-get install chromium`` (``/usr/bin/chromium``; scripts/test.sh installs it) and
the ``browser`` extra (jupyterlab, ipywidgets, playwright; never ``playwright install``: the
system's Chromium is used). Screenshots go to ``$TEST_ARTIFACTS_DIR`` (default: the
test's tmp dir).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from notebook_accel.launch.handoff.ports import free_port

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parent.parent
_MISSING = [name for name in ("playwright", "jupyterlab", "ipywidgets")
            if importlib.util.find_spec(name) is None]
BROWSER_MARKS = [  # and ``browser``, by folder (tests/browser/conftest.py)
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="/usr/bin/chromium is missing (apt-get install -y chromium)"),
    pytest.mark.skipif(bool(_MISSING), reason=f"not installed: {', '.join(_MISSING)} "
                       "(pip install jupyterlab ipywidgets playwright)"),
]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def artifacts_dir(tmp_path: Path) -> Path:
    """Where screenshots go: ``$TEST_ARTIFACTS_DIR``, else the test's tmp dir."""
    path = Path(os.environ.get("TEST_ARTIFACTS_DIR") or tmp_path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def notebook_json(cells: dict[str, str]) -> dict:
    """A notebook of code cells (id -> source), as the plain JSON a ``.ipynb`` holds (no
    ``nbformat`` import: it costs ~3 s)."""
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                    "language": "python"}},
        "cells": [{"cell_type": "code", "id": cell_id, "metadata": {}, "outputs": [],
                   "execution_count": None, "source": source}
                  for cell_id, source in cells.items()],
    }


def open_notebook(page, server: str, name: str) -> None:
    """Open ``name`` (under the server's root) in JupyterLab, tall enough for its cells, and
    wait for its kernel (``server``: what :func:`jupyter_lab` yields)."""
    base, token = server.split("|")
    page.set_viewport_size({"width": 1400, "height": 1800})
    page.goto(f"{base}/lab/tree/{name}?token={token}", timeout=60_000)
    wait_for_kernel(page)


def code_cell(page, index: int):
    """The notebook's ``index``-th code cell."""
    return page.locator(".jp-Notebook .jp-CodeCell").nth(index)


def cell_prompt(cell) -> str:
    """A cell's input prompt (``[3]:``, ``[*]:``), spaces collapsed."""
    return " ".join(cell.locator(".jp-InputPrompt").first.inner_text().split())


def cell_output(cell) -> str:
    """A cell's output area, as text."""
    return cell.locator(".jp-Cell-outputWrapper").inner_text()


def lab_env() -> dict[str, str]:
    """The server's environment: this checkout importable (and the test's config dirs)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _get(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def jupyter_lab(root: Path, env: dict[str, str], data: str = "data") -> Iterator[str]:
    """A JupyterLab server on 127.0.0.1 with a random token; yields its base URL + token query.

    ``data`` names its data dir (``root/.jp-<data>``), which holds the notary's secret: a
    server with another one treats notebooks saved before as untrusted.
    """
    port, token = free_port(), secrets.token_hex(16)
    for name in ("config", "runtime", "workspaces", "settings", data):
        (root / f".jp-{name}").mkdir(exist_ok=True)
    news = root / ".jp-settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True, exist_ok=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    env = {**env, "JUPYTER_CONFIG_DIR": str(root / ".jp-config"),
           "JUPYTER_DATA_DIR": str(root / f".jp-{data}"),
           "JUPYTER_RUNTIME_DIR": str(root / ".jp-runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / ".jp-workspaces"),
           "JUPYTERLAB_SETTINGS_DIR": str(root / ".jp-settings")}
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0",
           f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = (root / f"jupyter-{data}.log").open("w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _get(f"{base}/api/status?token={token}"):
            assert server.poll() is None, (root / f"jupyter-{data}.log").read_text()
            assert time.monotonic() < deadline, "JupyterLab did not start in 60 s"
            time.sleep(0.3)
        yield f"{base}|{token}"
    finally:
        with contextlib.suppress(OSError):
            request = urllib.request.Request(f"{base}/api/shutdown", method="POST",
                                             headers={"Authorization": f"token {token}"})
            urllib.request.urlopen(request, timeout=5).close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        log.close()


def wait_for_kernel(page) -> None:
    """Pitfall 1: "idle" shows before a kernel is attached; wait for a real kernel name too."""
    page.wait_for_function(
        """() => {
            const name = document.querySelector('.jp-NotebookPanel .jp-KernelName');
            const busy = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');
            return name && /Python/.test(name.textContent)
                && busy && busy.getAttribute('data-status') === 'idle';
        }""", timeout=60_000)




def run_all_cells(page) -> None:
    """Run → Run All Cells, picked by exact text (pitfall 2)."""
    page.locator("#jp-MainMenu .lm-MenuBar-itemLabel").get_by_text("Run", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()


@contextlib.contextmanager
def chromium(pw, profile: Path) -> Iterator[object]:
    """A headless Chromium page with a fresh profile."""
    browser = pw.chromium.launch_persistent_context(
        str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
        viewport={"width": 1400, "height": 1000})
    try:
        yield browser.pages[0] if browser.pages else browser.new_page()
    finally:
        browser.close()
