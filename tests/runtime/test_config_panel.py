"""The config panel's test button, which starts real workers (tests/unit/test_config_panel.py has the rest)."""

from __future__ import annotations

import pytest

from magics.panel.form import config_panel
from tests.unit.test_config_panel import CPU2


@pytest.fixture
def cfg_path(tmp_path):
    """The test's default config location (tests/conftest.py isolates it; no peer file)."""
    return tmp_path / "cache" / "notebook_accel" / "default_config.yaml"


@pytest.mark.slow
def test_panel_test_button_runs_real_workers(cfg_path):
    panel = config_panel(hardware=CPU2)
    panel.start_method.value = "fork"
    assert panel.test() is True, panel.test_output.outputs
    text = "".join(o["text"] for o in panel.test_output.outputs)
    assert "PASS" in text and "2 workers" in text
