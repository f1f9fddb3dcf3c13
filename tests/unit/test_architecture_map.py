"""docs/architecture.md is the map a newcomer reads: every module, script and benchmark is on it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"


def _named(words: set[str], path: Path) -> bool:
    return path.stem in words or path.name in words


def _unnamed() -> list[str]:
    text = MAP.read_text()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", text)) | set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    missing = []
    for package in ("notebook_accel", "magics"):
        for module in sorted((ROOT / package).rglob("*.py")):
            if module.name != "__init__.py" and not _named(words, module):
                missing.append(module)
    for entry in sorted((ROOT / "scripts").iterdir()):  # a folder of scripts is named as one
        if not _named(words, entry):
            missing.append(entry)
    for entry in sorted((ROOT / "benchmarks").iterdir()):
        if entry.is_file() and not _named(words, entry):
            missing.append(entry)
    return [str(path.relative_to(ROOT)) for path in missing]


def test_every_module_script_and_benchmark_is_on_the_map():
    assert _unnamed() == []


def test_the_map_names_no_module_that_is_gone():
    text = MAP.read_text()
    for path in re.findall(r"`((?:notebook_accel|magics|launch|runtime|strategies|backends|worker|scripts|tests|benchmarks)/[\w/]+\.(?:py|sh))", text):
        candidates = [ROOT / path, ROOT / "notebook_accel" / path, ROOT / "notebook_accel" / "launch" / path]
        assert any(c.exists() for c in candidates), f"docs/architecture.md names {path}, which does not exist"
