"""The magic's parts without a kernel: name analysis, shipping checks, names out, flags."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from magics.cell.names import analyse_cell, parsed_cell


@pytest.mark.parametrize("source, reads, assigns", [
    ("y = f(x)\nx = 1", ["f", "x"], ["y", "x"]),
    ("total = total + 1", ["total"], ["total"]),
    ("n += 1", ["n"], ["n"]),
    ("import torch.nn as nn, os.path\nfrom a.b import c as d\nm = nn.Linear(d, os)", [],
     ["nn", "os", "d", "m"]),
    ("del old\nnew = 1", ["old"], ["new"]),
    ("for i in range(k):\n    acc = acc + i\nprint(i)", ["range", "k", "acc", "print", "i"],
     ["i", "acc"]),
    ("if c:\n    z = 1\nelse:\n    z = 2\nprint(z)", ["c", "print"], ["z"]),
    ("if c:\n    z = 1\nprint(z)", ["c", "print", "z"], ["z"]),
    ("while go():\n    w = 1\nw", ["go", "w"], ["w"]),
    ("try:\n    w = risky()\nexcept E as e:\n    w = None\nprint(w, e)",
     ["risky", "E", "print", "e"], ["w", "e"]),
    ("with open(p) as fh:\n    text = fh.read()\ntext", ["open", "p"], ["fh", "text"]),
    ("sq = [v * k for v in items if v > lim]\nv", ["items", "lim", "k", "v"], ["sq"]),
    ("d2 = {a: b for a, b in pairs.items()}\nnested = [y for x in xs for y in x]",
     ["pairs", "xs"], ["d2", "nested"]),
    ("if (m := calc()) > 0:\n    pass\nprint(m)", ["calc", "print"], ["m"]),
    ("def g(a, b=default) -> Ret:\n    return helper(a) + b + later\nlater = 1\nr = g(1)",
     ["default", "Ret", "helper"], ["g", "later", "r"]),
    ("class M(Base):\n    size = dim\n    twice = size * 2\n    def f(self):\n        return other\n",
     ["Base", "dim", "other"], ["M"]),
    ("lam = lambda q, r=dflt: q + offset", ["dflt", "offset"], ["lam"]),
    ("def bump():\n    global hits\n    hits += 1\nbump()", ["hits"], ["bump", "hits"]),
    ("f'{name!r} {value:{width}}'", ["name", "value", "width"], []),
    ("def outer():\n    v = 1\n    def inner():\n        return v + [w for w in ws] + glob\n"
     "    return inner", ["ws", "glob"], ["outer"]),
    ("def setter():\n    global flag\n    flag = True", [], ["setter", "flag"]),
    ("match cmd:\n    case Point(x=px):\n        out = px\nprint(px)",
     ["cmd", "Point", "print", "px"], ["px", "out"]),
])
def test_names_read_and_assigned(source, reads, assigns):
    names = analyse_cell(source)
    assert list(names.reads) == reads
    assert list(names.assigns) == assigns


@pytest.mark.parametrize("source, star", [
    ("from os.path import *\nx = join('a')", True),
    ("if flag:\n    from math import *", True),
    ("from os.path import join\nimport math\nx = join('a')", False),
])
def test_a_star_import_is_known_from_the_one_reading_of_the_cell(source, star):
    assert analyse_cell(source).star_import is star
    assert parsed_cell(source)[1].star_import is star


def test_flags_only_a_pool_start_takes_are_named_as_written():
    from IPython.core.magic_arguments import parse_argstring

    from magics.accelerate_magic import AccelerateMagics
    from magics.cell.arguments import flags_given, pool_flags_given

    magic = AccelerateMagics.accelerate
    assert pool_flags_given(parse_argstring(magic, "-n 2")) == []
    assert pool_flags_given(parse_argstring(magic, "--no-heal")) == ["--no-heal"]
    assert pool_flags_given(parse_argstring(magic, "--heal")) == ["--heal"]
    assert flags_given(parse_argstring(magic, "-n 2 --heal")) == ["--num-processes", "--heal"]


def test_a_flags_line_run_again_is_parsed_once_and_each_cell_gets_its_own_copy(monkeypatch):
    from magics.accelerate_magic import AccelerateMagics
    from magics.cell import arguments

    magic = AccelerateMagics.accelerate
    first = arguments.parse_line(magic, "--pull a,b --ranks 1")

    def parse_again(*_):
        raise AssertionError("parsed again")

    monkeypatch.setattr(arguments, "parse_argstring", parse_again)
    second = arguments.parse_line(magic, "--pull a,b --ranks 1")
    assert vars(first) == vars(second) and first is not second
    assert second.pull == ("a", "b") and second.ranks == "1"
    second.pull = ()  # a cell's changes stay its own
    assert arguments.parse_line(magic, "--pull a,b --ranks 1").pull == ("a", "b")
    with pytest.raises(AssertionError, match="parsed again"):
        arguments.parse_line(magic, "--pull c")  # a line not seen before is parsed


def test_every_unshippable_name_is_listed_with_its_reason():
    from magics.cell.shipping import UnshippableNamesError, collect_names

    class Holder:
        def __init__(self):
            self.lock = threading.Lock()

    lock = threading.Lock()

    def uses_lock():
        return lock

    namespace = {"lock": lock, "holder": Holder(), "fake": types.ModuleType("fake_mod"),
                 "ok": [1, 2], "os": __import__("os"), "In": ["hidden"], "fn": uses_lock}
    with pytest.raises(UnshippableNamesError) as caught:
        collect_names(["lock", "holder", "fake", "ok", "os", "In", "print", "fn"], namespace)
    reasons = caught.value.reasons
    assert set(reasons) == {"lock", "holder", "fake", "fn"}
    assert reasons["fn"].endswith("(at fn (closure variable 'lock'))"), reasons["fn"]
    assert "cannot pickle '_thread.lock' object" in reasons["lock"]
    assert "holder.lock" in reasons["holder"]
    assert "fake_mod" in reasons["fake"] and "imported by name" in reasons["fake"]
    assert "no worker was started" in str(caught.value)
    rendered = "\n".join(caught.value._render_traceback_())
    assert "lock: TypeError" in rendered and "Traceback" not in rendered


def test_shipment_sends_modules_by_name_and_skips_ipython_names():
    from magics.cell.shipping import collect_names

    hidden_in = ["hidden"]
    namespace = {"np_alias": sys.modules["os"].path, "value": 3, "In": hidden_in, "f": len}
    shipment = collect_names(["np_alias", "value", "In", "f", "missing"], namespace,
                             hidden={"In": hidden_in})
    assert shipment.modules == {"np_alias": sys.modules["os"].path.__name__}
    assert shipment.values == {"value": 3, "f": len}


def test_names_out_keep_shared_objects_and_list_failures_in_one_line():
    import pickle

    from magics.cell.pulling import notice, unpack
    from magics.cell.runner import pack_names

    shared = [1, 2]
    packed = pack_names({"a": shared, "b": {"same": shared}, "lock": threading.Lock()})
    assert set(packed.failed) == {"lock"}
    values, failed = unpack(packed, ["a", "b", "lock", "gone"], explicit=True)
    assert values["b"]["same"] is values["a"]
    assert set(failed) == {"lock", "gone"} and failed["gone"] == "not defined on rank 0"
    line = notice(failed)
    assert "\n" not in line and line.startswith("[notebook_accel] not brought back")
    assert "lock (TypeError: cannot pickle '_thread.lock' object)" in line
    assert unpack(None, ["a"], explicit=False) == ({}, {})
    broken = type(packed)(pickle.dumps("not a dict")[:-3], {})
    values, failed = unpack(broken, ["a"], explicit=False)
    assert values == {} and "the kernel cannot load them" in failed["a"]


def test_flags_are_tri_state():
    from IPython.core.magic_arguments import parse_argstring

    from magics.accelerate_magic import AccelerateMagics
    from magics.cell.arguments import launch_options

    magic = AccelerateMagics.accelerate
    assert dict(launch_options(parse_argstring(magic, ""))) == {}  # unset: the layers below decide
    assert launch_options(parse_argstring(magic, "--fsdp"))["fsdp"] is True
    assert launch_options(parse_argstring(magic, "--no-fsdp"))["fsdp"] is False
    assert launch_options(parse_argstring(magic, "--no-deepspeed"))["deepspeed"] is False
    args = parse_argstring(magic, "-n 3 --mixed-precision bf16 --main-only --pull a,b --config f")
    assert launch_options(args)["num_processes"] == 3 and args.output == "main"
    assert args.pull == ("a", "b") and launch_options(args)["config_file"] == "f"
    assert parse_argstring(magic, "--no-pull").pull == ()
    assert parse_argstring(magic, "test -n 4").command == "test"


def test_config_without_panel_prints_a_clear_message(monkeypatch, capsys):
    from magics import commands

    monkeypatch.setitem(sys.modules, "magics.panel.form", None)
    assert commands.config(types.SimpleNamespace(config=None)) is None
    assert "configuration panel is not available" in capsys.readouterr().out


def test_cell_job_runs_the_cell_and_its_traceback_starts_at_the_magic_line(monkeypatch):
    import pickle
    import traceback

    from magics.cell.runner import CellCode, cell_job

    lines = ["%%accelerate -n 2\n", "y = base + 1\n", "z = helper(y)\n", "boom = 1 / 0\n"]
    cell = CellCode("\n" + "".join(lines[1:3]), "<cell-under-test>", lines[:3])
    cell.register()
    monkeypatch.setenv("LOCAL_RANK", "0")
    job = cell_job(cell, {"base": 1, "helper": lambda v: v * 10}, {"sys_alias": "sys"},
                   ("y", "z", "base"))
    assert pickle.loads(job().blob) == {"y": 2, "z": 20, "base": 1}
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert job() is None  # only the node's first worker sends names back

    failing = CellCode("\n" + "".join(lines[1:]), "<failing-cell>", lines)
    failing.register()
    with pytest.raises(ZeroDivisionError) as caught:
        cell_job(failing, {"base": 1, "helper": abs}, {}, ())()
    frames = list(traceback.walk_tb(caught.value.__traceback__))[1:]  # [0]: this test
    shown = [(frame.f_code.co_filename, line) for frame, line in frames
             if not frame.f_locals.get("__tracebackhide__")]  # what the worker reports
    assert shown == [("<failing-cell>", 4)]


def test_a_cell_run_again_is_not_parsed_and_analysed_again():
    text = "import torch\nt = torch.ones(1)\nu = t + v"
    tree, names = parsed_cell(text)
    assert parsed_cell(text) == (tree, names) and parsed_cell(text)[0] is tree
    assert names == analyse_cell(text) == analyse_cell(tree)
    with pytest.raises(SyntaxError):
        parsed_cell("x = (")


def test_a_cell_run_again_under_its_name_is_not_compiled_again():
    from magics.cell.runner import CELL_VALUE, CellCode

    text = "\nx = 2\nx * 3"
    tree, _ = parsed_cell(text)
    first = CellCode(text, "/tmp/ipykernel_1/1234.py", []).compile_tree(tree)
    assert CellCode(text, "/tmp/ipykernel_1/1234.py", []).compile_tree(tree) is first  # Jupyter: same text, same name
    other = CellCode(text, "<ipython-input-5-ab>", []).compile_tree(tree)
    assert other is not first and other.co_filename == "<ipython-input-5-ab>"
    namespace = {}
    exec(other, namespace)
    assert namespace[CELL_VALUE] == 6 and not hasattr(tree.body[-1], "targets")  # the shared tree left as it was
