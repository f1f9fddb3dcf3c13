"""notebook_accel.cli.sanity.run_sanity_check from plain Python (the CLI and the panel call it so)."""

from __future__ import annotations

from notebook_accel.cli import sanity


def test_sanity_check_passes_with_mixed_precision_and_fails_on_a_wrong_reference(
        monkeypatch, capsys):
    monkeypatch.setenv("NOTEBOOK_ACCEL_CONFIG_FILE", "/nonexistent/notebook_accel.yaml")
    assert sanity.run_sanity_check(2, mixed_precision="bf16", start_method="fork") is True
    out = capsys.readouterr().out
    assert "mixed precision bf16" in out and out.count("  PASS  ") == 4
    assert "Test is a success!" in out

    right = sanity._train_reference
    monkeypatch.setattr(sanity, "_train_reference", lambda world: right(world) + 0.1)
    assert sanity.run_sanity_check(2, start_method="fork") is False
    captured = capsys.readouterr()
    assert "  FAIL  the weights match a single-process run" in captured.out
    assert "Test failed" in captured.err
