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


def test_nothing_in_the_repository_points_outside_it():
    outside = []
    for path in [ROOT / "README.md", ROOT / "pyproject.toml", *(ROOT / "docs").glob("*.md")]:
        text = path.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)", text):  # relative markdown links resolve here
            if "://" not in target and not (path.parent / target).resolve().is_relative_to(ROOT):
                outside.append(f"{path.name}: {target}")
            elif "://" not in target and not (path.parent / target).exists():
                outside.append(f"{path.name}: {target} (missing)")
    for package in ("notebook_accel", "magics", "tests", "scripts", "benchmarks", "docs"):
        for path in (ROOT / package).rglob("*"):
            if path.suffix in {".py", ".md", ".sh", ".toml"} and path.is_file():
                text = path.read_text(errors="replace")
                outside += [f"{path.relative_to(ROOT)}: {word}" for word in ("DESIGN.md", "../shared")
                            if word in text and path.name != "test_architecture_map.py"]
    assert outside == []
