"""Would ``pip install notebook-accel[notebook]`` replace a platform's pins? Ask pip itself.

A platform profile (``tests/platforms/<name>.txt``) is the pins of its published package list.
Each pin becomes a metadata-only distribution in a throwaway venv (so nothing multi-GB is
downloaded: pip sees ``torch 2.9.0+cu126`` as installed), our requirements (pyproject.toml's,
as a metadata-only wheel) are requested together with the pins, and pip's resolver runs for
real (``--dry-run``, for the profile's Python version). A range that excludes a pin makes the
resolution impossible; nothing pinned may appear among what pip would install.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip's own copy
    from pip._vendor import tomli as tomllib

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
PROFILES = sorted(path.stem for path in HERE.glob("*.txt"))
# Metadata-only stand-ins for packages that are not on PyPI, with what the real ones require.
STAND_IN_REQUIRES = {"google-colab": ["ipython==7.34.0"]}


def canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Profile:
    name: str
    python: str  # "3.13": the platform's Python, which pip resolves for
    pins: dict[str, str]  # canonical name -> version


def load(name: str) -> Profile:
    """The profile ``tests/platforms/<name>.txt``: ``name==version`` lines and a
    ``(python: X.Y)`` note in its header comment."""
    path = HERE / f"{name}.txt"
    text = path.read_text()
    python = re.search(r"python: (\d+\.\d+)", text)
    if python is None:
        raise ValueError(f"{path}: the header names no '(python: X.Y)'")
    pins = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line:
            pin, version = line.split("==")
            pins[canonical(pin)] = version
    return Profile(name, python[1], pins)


def project_requirements() -> tuple[str, list[str], dict[str, list[str]]]:
    """pyproject.toml's version, dependencies and optional dependencies."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["version"], project["dependencies"], project["optional-dependencies"]


def _metadata(name: str, version: str, requires: list[str], extras: dict[str, list[str]]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {req}" for req in requires]
    for extra, reqs in extras.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {req} ; extra == "{extra}"' for req in reqs]
    return "\n".join(lines) + "\n"


def install_stand_in(site: Path, name: str, version: str, requires: list[str] = ()) -> None:
    """Make ``name==version`` look installed in ``site`` (its metadata, no code)."""
    info = site / f"{canonical(name).replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(_metadata(name, version, list(requires), {}))
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def our_wheel(dest: Path, notebook_extra: list[str] | None = None) -> Path:
    """A metadata-only wheel of this project with pyproject.toml's requirements (the
    notebook extra replaced by ``notebook_extra`` when given)."""
    version, requires, extras = project_requirements()
    if notebook_extra is not None:
        extras = {**extras, "notebook": notebook_extra}
    info = f"notebook_accel-{version}.dist-info"
    wheel = dest / f"notebook_accel-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{info}/METADATA", _metadata("notebook-accel", version, requires, extras))
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


@dataclass
class Resolution:
    ok: bool
    installs: dict[str, str]  # canonical name -> version pip would install
    replaced: dict[str, tuple[str, str]]  # pinned name -> (pin, what pip would install)
    output: str  # pip's stderr (the conflict, when there is one)


def resolve(profile: Profile, wheel: Path, extra: str | None, work: Path) -> Resolution:
    """Run pip's resolver on ``wheel[extra]`` with ``profile``'s pins installed and required."""
    env_dir = work / f"venv-{profile.name}"
    venv.create(env_dir, with_pip=False)
    site = next(env_dir.glob("lib/python*/site-packages"))
    for name, version in profile.pins.items():
        install_stand_in(site, name, version, STAND_IN_REQUIRES.get(name, []))
    pins = work / f"pins-{profile.name}.txt"
    pins.write_text("".join(f"{name}=={version}\n" for name, version in profile.pins.items()))
    report = work / f"report-{profile.name}.json"
    target = f"{wheel}[{extra}]" if extra else str(wheel)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install",
         "--dry-run", "--quiet", "--report", str(report), "--only-binary", ":all:",
         "--python-version", profile.python, target, "-r", str(pins)],
        capture_output=True, text=True, timeout=240,
    )
    installs = {}
    if done.returncode == 0:
        for item in json.loads(report.read_text())["install"]:
            installs[canonical(item["metadata"]["name"])] = item["metadata"]["version"]
    replaced = {name: (profile.pins[name], version)
                for name, version in installs.items() if name in profile.pins}
    return Resolution(done.returncode == 0, installs, replaced, done.stderr)
