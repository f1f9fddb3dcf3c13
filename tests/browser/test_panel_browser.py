"""The config panel in a real browser: JupyterLab + headless Chromium driven by Playwright
(the form and its label column, Save, Show as code as a code block, Test, then DeepSpeed chosen,
shown as chosen and saved, and a bad combination refused).

Needs ``apt-get install chromium`` (``/usr/bin/chromium``) and ``pip install jupyterlab
ipywidgets playwright`` (never ``playwright install``). The screenshot
(``config_panel.png``) is written to ``$TEST_ARTIFACTS_DIR`` (default: the test's tmp dir).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import yaml

from tests.browser_support import (
    BROWSER_MARKS,
    artifacts_dir,
    chromium,
    jupyter_lab,
    lab_env,
    notebook_json,
    open_notebook,
    run_all_cells,
)

pytestmark = BROWSER_MARKS
NOTEBOOK = notebook_json(
    {"panel": "from magics.panel.form import config_panel\nconfig_panel()"})


def _read_yaml(path: Path) -> dict:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


_LABEL_BOXES = """p => Object.fromEntries([...p.querySelectorAll('.widget-label')]
    .filter(e => e.offsetParent !== null).map(e => { const r = e.getBoundingClientRect();
        return [e.textContent.trim(), [Math.round(r.left), Math.round(r.width), getComputedStyle(e).textAlign]]; }))"""


# whether a select's widest option fits its box (measured in the select's own font)
_LONGEST_FITS = """e => { const c = document.createElement('canvas').getContext('2d');
    c.font = getComputedStyle(e).font;
    const widest = Math.max(...[...e.options].map(o => c.measureText(o.text).width));
    return widest + 24 <= e.clientWidth; }"""


def _top(locator) -> float:
    return locator.evaluate("e => e.getBoundingClientRect().top")


def test_panel_renders_in_jupyterlab_and_saves(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    artifacts = artifacts_dir(tmp_path)
    root = tmp_path / "lab"
    root.mkdir()
    (root / "panel.ipynb").write_text(json.dumps(NOTEBOOK))  # plain JSON: no nbformat import
    config = tmp_path / "cache" / "notebook_accel" / "default_config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("num_processes: 1\nstart_method: fork\nmixed_precision: 'no'\n")

    with jupyter_lab(root, lab_env()) as server, sync_playwright() as pw, \
            chromium(pw, tmp_path / "profile") as page:
        try:
            open_notebook(page, server, "panel.ipynb")
            run_all_cells(page)

            panel = page.locator(".notebook-accel-config-panel")
            expect(panel).to_be_visible(timeout=60_000)
            expect(panel).to_contain_text("CPU cores")
            expect(panel).to_contain_text(f"{config} (loaded)")
            processes = panel.locator(".widget-inline-hbox", has_text="Processes").locator("input")
            expect(processes).to_have_value("1")  # the file's values are shown
            expect(panel.locator("select").first).to_have_value("auto")
            labels = panel.evaluate(_LABEL_BOXES)  # one label column: same left x, width, alignment
            assert labels["Mixed precision"] == labels["Strategy"] == labels["Device"] == labels[
                "torch.compile"], labels
            ddp = panel.locator("button.widget-toggle-button", has_text="DDP")
            expect(ddp).to_have_class(re.compile("mod-primary"))  # the chosen strategy stands out
            assert ddp.evaluate("e => getComputedStyle(e).color") == "rgb(255, 255, 255)"
            fp16 = panel.get_by_role("button", name="fp16", exact=True)
            expect(fp16).to_be_disabled()
            expect(fp16).to_have_attribute("title", re.compile("^needs a GPU"))  # tooltip

            processes.fill("99")  # more than allowed: changed, and the panel says so
            processes.press("Tab")
            expect(panel).to_contain_text("Processes 99 changed to 8: at most 8 on cpu")
            expect(processes).to_have_value("8")
            processes.fill("2")
            processes.press("Tab")
            bf16 = panel.locator("button.widget-toggle-button", has_text="bf16")  # + a check icon
            bf16.click()
            expect(bf16).to_have_class(re.compile("mod-primary"), timeout=20_000)  # stands out
            panel.locator(".widget-inline-hbox", has_text="Start method").locator(
                "select").select_option("spawn")
            panel.get_by_role("button", name="Save").click()  # the icon joins the name
            expect(panel).to_contain_text(f"Saved to {config}", timeout=30_000)
            expect(panel).to_contain_text(f"Config file: {config} (saved")  # the header too

            deadline = time.monotonic() + 20
            while _read_yaml(config).get("mixed_precision") != "bf16":
                assert time.monotonic() < deadline, config.read_text()
                time.sleep(0.2)
            data = _read_yaml(config)
            assert (data["num_processes"], data["mixed_precision"], data["start_method"]) == (
                2, "bf16", "spawn"), data

            panel.get_by_role("button", name="Show as code").click()
            code = panel.locator("pre code")  # a code block, in a monospace font
            expect(code.first).to_contain_text("notebook_launcher(")
            font = code.first.evaluate("e => getComputedStyle(e).fontFamily")
            assert "monospace" in font, font
            expect(code).to_have_count(2)  # the call and the %%accelerate line: two cells
            expect(code.nth(1)).to_have_text(re.compile(r"^%%accelerate -n 2"))
            panel.get_by_role("button", name="Test").click()  # real workers, forked by the kernel
            expect(panel).to_contain_text("Test passed", timeout=120_000)
            expect(panel).to_contain_text(f"Saved to {config}")  # not replaced by the Test
            log = panel.locator(".jp-OutputArea-output", has_text="PASS").first
            expect(log).to_be_visible()
            verdict = panel.get_by_text("Test passed")  # between the code boxes and its log
            assert _top(code.nth(1)) < _top(verdict) < _top(log)
            assert "ⓘ" not in panel.inner_text()  # no glyph that may be missing

            panel.get_by_role("button", name="FSDP", exact=True).click()
            wrap = panel.locator(".widget-inline-hbox", has_text="Wrap policy").locator("select")
            expect(wrap).to_be_visible(timeout=20_000)
            for label in ("Wrap policy", "Checkpoints"):  # the longest choices fit, unclipped
                select = panel.locator(".widget-inline-hbox", has_text=label).locator("select")
                assert select.evaluate(_LONGEST_FITS), label
            reshard = panel.locator(".widget-checkbox", has_text="Reshard after forward")
            box_left = reshard.locator("input").evaluate("e => e.getBoundingClientRect().left")
            assert abs(box_left - wrap.evaluate("e => e.getBoundingClientRect().left")) < 8
            panel.get_by_role("button", name="DeepSpeed", exact=True).click()  # the third strategy
            expect(panel.locator("button.widget-toggle-button", has_text="DeepSpeed")).to_have_class(
                re.compile("mod-primary"), timeout=20_000)
            expect(ddp).not_to_have_class(re.compile("mod-primary"))
            stage = panel.locator(".widget-inline-hbox", has_text="ZeRO stage").locator("select")
            expect(stage).to_be_visible(timeout=20_000)
            stage.select_option(label="3: + parameters")
            panel.locator(".widget-inline-hbox", has_text="Offload parameters").locator(
                "select").select_option("cpu")  # enabled once the stage is 3
            panel.get_by_role("button", name="Save").click()
            deadline = time.monotonic() + 20
            while (_read_yaml(config).get("deepspeed_config") or {}).get("offload_param_device") != "cpu":
                assert time.monotonic() < deadline, config.read_text()
                time.sleep(0.2)
            data = _read_yaml(config)
            assert (data["distributed_type"], data["deepspeed_config"]["zero_stage"]) == ("DEEPSPEED", 3), data
            stage.select_option(label="2: + gradients")  # parameters offloaded at stage 2: refused
            expect(panel).to_contain_text("needs zero_stage 3, not 2", timeout=20_000)
            expect(panel.get_by_role("button", name="Save")).to_be_disabled()
        finally:
            page.screenshot(path=str(artifacts / "config_panel.png"), full_page=True)
    assert (artifacts / "config_panel.png").stat().st_size > 1000
    assert re.search(r"num_processes: 2\n", config.read_text())
