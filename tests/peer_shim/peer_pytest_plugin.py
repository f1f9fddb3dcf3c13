"""A pytest plugin for ``run_peer_tests.py``: departures deselected, outcomes counted per file.

Reads ``PEER_DEPARTURES`` (a JSON file: ``{nodeid pattern: reason}``, fnmatch patterns),
writes ``PEER_REPORT`` (JSON): per file ``passed``/``failed``/``skipped``/``departures``,
the failed test ids with the last line of their error, the departure patterns that matched
nothing (a stale list), and ``leaked``: every ``accelerate`` module that is not the shim's
(the real package must never be imported).
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

SHIM = Path(__file__).resolve().parent / "accelerate"

_departures: dict[str, str] = json.loads(Path(os.environ["PEER_DEPARTURES"]).read_text())
_counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(
    ("passed", "failed", "skipped", "departures"), 0))
_failures: dict[str, str] = {}
_used: set[str] = set()


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    kept, dropped = [], []
    for item in items:
        hits = [p for p in _departures if fnmatch.fnmatchcase(item.nodeid, p)]
        _used.update(hits)
        (dropped if hits else kept).append(item)
        _counts[_file(item.nodeid)]["departures"] += bool(hits)  # every collected file has a row
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _error(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    return text[:400]


def pytest_collectreport(report):
    if report.failed:  # a file that does not import
        _counts[_file(report.nodeid)]["failed"] += 1
        _failures[report.nodeid] = _error(report)


def pytest_runtest_logreport(report):
    counts = _counts[_file(report.nodeid)]
    if report.failed and report.nodeid not in _failures:
        counts["failed"] += 1
        _failures[report.nodeid] = _error(report)
    elif report.skipped and report.when in ("setup", "call"):
        counts["skipped"] += 1
    elif report.passed and report.when == "call":
        counts["passed"] += 1


def _leaked() -> list[str]:
    leaked = []
    for name, module in list(sys.modules.items()):
        if name == "accelerate" or name.startswith("accelerate."):
            path = getattr(module, "__file__", None) or ""
            if "site-packages" in path and "notebook_accel" not in path:
                leaked.append(f"{name} ({path})")
    return sorted(leaked)


def pytest_sessionfinish(session):
    import accelerate

    report = {
        "files": dict(_counts),
        "failures": _failures,
        "stale_departures": sorted(set(_departures) - _used),
        "shim": str(Path(accelerate.__file__).resolve()),
        "leaked": _leaked(),
    }
    Path(os.environ["PEER_REPORT"]).write_text(json.dumps(report, indent=1))
