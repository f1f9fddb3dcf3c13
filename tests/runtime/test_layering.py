"""The engine works without the notebook front end: no IPython, no ipywidgets, no ``magics``.

A fresh interpreter is started whose every import of ``IPython``, ``ipywidgets`` or ``magics``
fails as if they were not installed (a meta-path finder, installed by a ``sitecustomize`` on
``PYTHONPATH`` so that worker interpreters the launcher starts get it too). In it,
``import notebook_accel``, ``from notebook_accel import *`` and a 2-process ``notebook_launcher``
job (gloo all-reduce, by fork and by spawn) must work, and no process may have imported them.
The import-linter contracts in pyproject.toml say the same statically; this proves it at run time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("IPython", "ipywidgets", "magics")

SITECUSTOMIZE = f"""
import sys

BLOCKED = {BLOCKED!r}


class _NotInstalled:
    \"\"\"Imports of the front end's packages fail as if they were not installed.\"\"\"

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by test_layering)", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled)
"""

JOB = """
import json
import sys

import notebook_accel
from notebook_accel import *  # noqa: F403 - every public name, without the front end
from notebook_accel import notebook_launcher


def job(tag):
    import sys

    import torch
    import torch.distributed as dist

    from notebook_accel import Accelerator

    try:
        import IPython  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("the blocker is not active in the worker")
    acc = Accelerator()
    total = acc.reduce(torch.tensor([float(acc.process_index + 1)]), reduction="sum")
    front_end = sorted({m.split(".")[0] for m in sys.modules} & {"IPython", "ipywidgets", "magics"})
    return {"tag": tag, "world": dist.get_world_size(), "sum": total.item(), "front_end": front_end}


results = {}
for method in ("fork", "spawn"):
    results[method] = notebook_launcher(job, args=(method,), num_processes=2, start_method=method,
                                        return_all=True, timeout=120)
kernel_side = sorted({m.split(".")[0] for m in sys.modules} & {"IPython", "ipywidgets", "magics", "ray"})
print("RESULT " + json.dumps({"results": results, "kernel_side": kernel_side, "file": notebook_accel.__file__}))
"""


def _blocked_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    return env


def _run(code: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_the_blocker_blocks(tmp_path):
    code = textwrap.dedent(f"""
        for name in {BLOCKED!r}:
            try:
                __import__(name)
            except ImportError:
                print("blocked", name)
    """)
    out = _run(code, _blocked_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"blocked {m}" for m in BLOCKED]


def test_engine_imports_and_launches_without_ipython_or_ipywidgets(tmp_path):
    out = _run(JOB, _blocked_env(tmp_path))
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    report = json.loads(line[len("RESULT "):])
    assert report["kernel_side"] == []
    assert Path(report["file"]).resolve() == ROOT / "notebook_accel" / "__init__.py"  # this checkout
    for method in ("fork", "spawn"):
        ranks = report["results"][method]
        assert [r["world"] for r in ranks] == [2, 2], ranks
        assert [r["sum"] for r in ranks] == [3.0, 3.0], ranks
        assert all(r["front_end"] == [] and r["tag"] == method for r in ranks), ranks


def test_config_panel_is_the_front_ends():
    import notebook_accel

    assert "config_panel" not in notebook_accel.__all__
    with pytest.raises(AttributeError):
        notebook_accel.config_panel  # noqa: B018 - the magic and magics.panel.form keep it
