"""docs/peer_compat.md's table lists every peer test the runners deselect or replace, and nothing
else: the departures are documented where users read them, and the list cannot go stale."""

from __future__ import annotations

import re
from pathlib import Path

from tests.peer_shim import run_peer_script, run_peer_tests

DOC = Path(__file__).resolve().parents[2] / "docs" / "peer_compat.md"


def _table_cells() -> list[str]:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ")]
    return [row.split(" | ")[0] for row in rows[1:]]  # the first column, after the header


def test_every_deselected_peer_test_is_in_the_table():
    listed = set(re.findall(r"`([^`]+)`", " ".join(_table_cells())))
    assert set(run_peer_tests.DEPARTURES) - listed == set()


def test_every_replaced_check_is_in_the_table_and_the_table_lists_no_other_test():
    cells = " ".join(_table_cells())
    for script, checks in run_peer_script.CHANGED.items():
        for name in checks:
            assert name in cells, (script, name)
    named = {p for p in re.findall(r"`([^`]+)`", cells) if "::" in p}
    assert named <= set(run_peer_tests.DEPARTURES)
