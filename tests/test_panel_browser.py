"""The config panel in a real browser: JupyterLab + headless Chromium driven by Playwright.

Needs ``apt-get install chromium`` (``/usr/bin/chromium``) and ``pip install jupyterlab
ipywidgets playwright`` (never ``playwright install``). The screenshot is written to
``$TEST_ARTIFACTS_DIR`` (default: the test's tmp dir).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
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
import yaml

from notebook_accel.launch.ports import free_port

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parent.parent
_MISSING = [name for name in ("playwright", "jupyterlab", "ipywidgets")
            if importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.browser,
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
NOTEBOOK = {
    "nbformat": 4, "nbformat_minor": 5,
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                "language": "python"}},
    "cells": [{"cell_type": "code", "id": "panel", "metadata": {}, "outputs": [],
               "execution_count": None,
               "source": "from magics.config_panel import config_panel\nconfig_panel()"}],
}


def _get(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def jupyter_lab(root: Path, env: dict[str, str]) -> Iterator[str]:
    """A JupyterLab server on 127.0.0.1 with a random token; yields its base URL + token query."""
    port, token = free_port(), secrets.token_hex(16)
    for name in ("config", "runtime", "workspaces", "settings"):
        (root / f".jp-{name}").mkdir()
    news = root / ".jp-settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    env = {**env, "JUPYTER_CONFIG_DIR": str(root / ".jp-config"),
           "JUPYTER_RUNTIME_DIR": str(root / ".jp-runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(root / ".jp-workspaces"),
           "JUPYTERLAB_SETTINGS_DIR": str(root / ".jp-settings")}
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0",
           f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = (root / "jupyter.log").open("w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _get(f"{base}/api/status?token={token}"):
            assert server.poll() is None, (root / "jupyter.log").read_text()
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


def _read_yaml(path: Path) -> dict:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def _wait_for_kernel(page) -> None:
    """Pitfall 1: "idle" shows before a kernel is attached; wait for a real kernel name too."""
    page.wait_for_function(
        """() => {
            const name = document.querySelector('.jp-NotebookPanel .jp-KernelName');
            const busy = document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator');
            return name && /Python/.test(name.textContent)
                && busy && busy.getAttribute('data-status') === 'idle';
        }""", timeout=60_000)


def test_panel_renders_in_jupyterlab_and_saves(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    artifacts = Path(os.environ.get("TEST_ARTIFACTS_DIR") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    root = tmp_path / "lab"
    root.mkdir()
    (root / "panel.ipynb").write_text(json.dumps(NOTEBOOK))  # plain JSON: no nbformat import
    config = tmp_path / "cache" / "notebook_accel" / "default_config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("num_processes: 1\nstart_method: fork\nmixed_precision: 'no'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTEBOOK_ACCEL_")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))

    with jupyter_lab(root, env) as server, sync_playwright() as pw:
        base, token = server.split("|")
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        page = browser.pages[0] if browser.pages else browser.new_page()
        try:
            page.goto(f"{base}/lab/tree/panel.ipynb?token={token}", timeout=60_000)
            _wait_for_kernel(page)
            page.locator("#jp-MainMenu .lm-MenuBar-itemLabel").get_by_text(
                "Run", exact=True).click()
            page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()

            panel = page.locator(".notebook-accel-config-panel")
            expect(panel).to_be_visible(timeout=60_000)
            expect(panel).to_contain_text("CPU cores")
            expect(panel).to_contain_text(f"{config} (loaded)")
            processes = panel.locator(".widget-inline-hbox", has_text="Processes").locator("input")
            expect(processes).to_have_value("1")  # the file's values are shown
            expect(panel.locator("select").first).to_have_value("auto")
            fp16 = panel.get_by_role("button", name="fp16", exact=True)
            expect(fp16).to_be_disabled()
            expect(fp16).to_have_attribute("title", re.compile("fp16 needs a GPU"))  # tooltip

            processes.fill("2")
            processes.press("Tab")
            panel.get_by_role("button", name="bf16", exact=True).click()
            panel.locator(".widget-inline-hbox", has_text="Start method").locator(
                "select").select_option("spawn")
            panel.get_by_role("button", name="Save").click()  # the icon joins the name
            expect(panel).to_contain_text(f"Saved to {config}", timeout=30_000)

            deadline = time.monotonic() + 20
            while _read_yaml(config).get("mixed_precision") != "bf16":
                assert time.monotonic() < deadline, config.read_text()
                time.sleep(0.2)
            data = _read_yaml(config)
            assert (data["num_processes"], data["mixed_precision"], data["start_method"]) == (
                2, "bf16", "spawn"), data

            panel.get_by_role("button", name="Test").click()  # real workers, forked by the kernel
            expect(panel).to_contain_text("Test passed", timeout=120_000)
            expect(panel.locator(".jp-OutputArea-output", has_text="PASS").first).to_be_visible()
        finally:
            page.screenshot(path=str(artifacts / "config_panel.png"), full_page=True)
            browser.close()
    assert (artifacts / "config_panel.png").stat().st_size > 1000
    assert re.search(r"num_processes: 2\n", config.read_text())
