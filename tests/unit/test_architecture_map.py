"""docs/architecture.md is the map a newcomer reads: every module, script and benchmark is on it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"


def _named(words: set[str], path: Path) -> bool:
    return path.stem in words or path.name in words


def _tree_entry(text: str, name: str) -> set[str]:
    """The words of the tree's entry for ``name`` (its line and the indented lines after it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(name))
    indent = len(name) - len(name.lstrip())
    end = next((i for i in range(start + 1, len(lines))
                if len(lines[i]) - len(lines[i].lstrip()) <= indent), len(lines))
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", "\n".join(lines[start:end])))


def _entry_of(text: str, module: Path) -> set[str]:
    """The words of the tree's entry that holds ``module``: its folder's (``    views/``,
    ``  runtime/``), else its package's (``notebook_accel/`` or ``magics/``: the whole tree)."""
    folders = module.parts[1:-1]
    for depth in range(len(folders), 0, -1):
        name = " " * (2 * depth) + folders[depth - 1] + "/"
        if any(line.startswith(name + " ") for line in text.splitlines()):
            return _tree_entry(text, name)
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def _unnamed() -> list[str]:
    text = MAP.read_text()
    missing = []
    for package in ("notebook_accel", "magics"):
        for module in sorted((ROOT / package).rglob("*.py")):
            if module.name != "__init__.py" and module.stem not in _entry_of(text, module.relative_to(ROOT)):
                missing.append(module)
    scripts = _tree_entry(text, "scripts/")  # a script is named where the scripts are
    for entry in sorted((ROOT / "scripts").iterdir()):  # a folder of scripts is named as one
        if not _named(scripts, entry):
            missing.append(entry)
    listed = _tree_entry(text, "benchmarks/")  # a benchmark is named where the benchmarks are
    for entry in sorted((ROOT / "benchmarks").iterdir()):
        if entry.is_file() and entry.stem not in listed:
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
