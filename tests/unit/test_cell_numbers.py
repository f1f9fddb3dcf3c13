"""Which notebook cell a file name is, on IPython 8+ (its own map) and 7 (rebuilt from history)."""

from __future__ import annotations

import linecache
import pickle
from types import SimpleNamespace

import pytest

from notebook_accel.launch.handoff.cells import cell_numbers
from notebook_accel.launch.handoff.payload import load_payload, serialise_payload


def _entry(name: str, text: str) -> tuple:
    """An IPython 7 linecache entry: with a modification time, unlike IPython 8's."""
    return (len(text), 1700000000.0, [line + "\n" for line in text.splitlines()], name)


@pytest.fixture
def ipython7(monkeypatch):
    """A shell of IPython 7 under ipykernel 6: temporary-file cell names, no ``_filename_map``."""
    cells = {
        "/tmp/ipykernel_1/111.py": _entry("/tmp/ipykernel_1/111.py", "def f():\n    return 1\n"),
        "/tmp/ipykernel_1/222.py": _entry("/tmp/ipykernel_1/222.py", "%%accelerate -n 2\nx = 1\n"),
        "<ipython-input-7-0123456789ab>": _entry("<ipython-input-7-0123456789ab>", "y = 2\n"),
        "/tmp/ipykernel_1/333.py": _entry("/tmp/ipykernel_1/333.py", "never run with history\n"),
    }
    monkeypatch.setattr(linecache, "_ipython_cache", cells, raising=False)
    for name, entry in cells.items():
        monkeypatch.setitem(linecache.cache, name, entry)
    magic = "get_ipython().run_cell_magic('accelerate', '-n 2', 'x = 1\\n')"
    history = SimpleNamespace(
        input_hist_raw=["", "import os", "def f():\n    return 1", "%%accelerate -n 2\nx = 1"],
        input_hist_parsed=["", "import os", "def f():\n    return 1", magic],
    )
    return SimpleNamespace(compile=SimpleNamespace(), history_manager=history)


def test_ipython8_map_is_used_as_it_is():
    names = {"/tmp/ipykernel_1/5.py": 3}
    assert cell_numbers(SimpleNamespace(compile=SimpleNamespace(_filename_map=names))) is names
    assert cell_numbers(None) == {}


def test_ipython7_cells_are_numbered_from_the_history(ipython7):
    assert cell_numbers(ipython7) == {
        "/tmp/ipykernel_1/111.py": 2,  # a cell as typed
        "/tmp/ipykernel_1/222.py": 3,  # %%accelerate recaches the raw cell under its name
        "<ipython-input-7-0123456789ab>": 7,  # IPython 7 without ipykernel 6: in the name
    }


def test_ipython7_cell_sources_travel_to_spawned_workers(ipython7):
    def f():
        return 1

    f.__code__ = f.__code__.replace(co_filename="/tmp/ipykernel_1/111.py")
    payload = serialise_payload(f, (), {})
    assert pickle.loads(payload)[3]["/tmp/ipykernel_1/111.py"][1] is None  # checkcache keeps it
    del linecache.cache["/tmp/ipykernel_1/111.py"]  # as in a spawned worker
    load_payload(payload)
    linecache.checkcache("/tmp/ipykernel_1/111.py")
    assert linecache.getline("/tmp/ipykernel_1/111.py", 2) == "    return 1\n"


def test_a_warm_pools_payloads_carry_only_the_cells_its_workers_do_not_have(monkeypatch):
    """Sources and numbers travel with a payload once per set of workers, so a pool cell of a
    long session does not carry (nor look through) every cell run before it."""
    from IPython.core.interactiveshell import InteractiveShell

    from notebook_accel.launch.handoff import cells

    shell = InteractiveShell.instance()
    monkeypatch.setattr(cells, "notebook_shell", lambda: shell)
    for number in range(3):
        shell.run_cell(f"value_{number} = {number}", store_history=True)

    def numbered() -> dict[str, int]:
        return {name: n for name, n in shell.compile._filename_map.items()
                if name in linecache.cache}

    def f():
        return 1

    sent = cells.SentCells()
    first = pickle.loads(serialise_payload(f, (), {}, sent=sent))
    assert numbered().items() <= first[4].items() and set(numbered()) <= set(first[3])
    again = pickle.loads(serialise_payload(f, (), {}, sent=sent))
    assert again[3] == {} and again[4] == {}  # the workers have them
    shell.run_cell("value_3 = 3", store_history=True)
    (newest,) = set(numbered()) - set(first[4])
    third = pickle.loads(serialise_payload(f, (), {}, sent=sent))
    assert third[4] == {newest: numbered()[newest]} and list(third[3]) == [newest]
    fresh = pickle.loads(serialise_payload(f, (), {}))  # new workers: everything
    assert numbered().items() <= fresh[4].items()
    monkeypatch.setattr(cells, "NUMBERS", {})
    monkeypatch.setattr("notebook_accel.launch.handoff.payload.NUMBERS", cells.NUMBERS)
    load_payload(serialise_payload(f, (), {}))
    assert numbered().items() <= cells.NUMBERS.items()  # where a worker's debugger reads them


def test_a_payload_reads_only_linecache_names_added_since_and_those_left(monkeypatch):
    """linecache only appends: the sources after the last name sent are the new ones; a lazy
    entry, one over the budget and one whose last name is gone are still sent, once."""
    from notebook_accel.launch.handoff import cells, payload

    def cell(name: str, text: str = "x = 1\n") -> tuple:  # IPython 8's: no modification time
        return (len(text), None, [text], name)

    cache = {"<cell 1>": cell("<cell 1>"), "<lazy>": (lambda: ["z = 3\n"],)}
    monkeypatch.setattr(linecache, "cache", cache)
    sent = cells.SentCells()

    def sources() -> list[str]:
        return list(pickle.loads(serialise_payload(len, (), {}, sent=sent))[3])

    assert sources() == ["<cell 1>"]  # the lazy entry holds no lines yet: left
    assert sources() == []
    cache["<cell 2>"] = cell("<cell 2>")
    cache["<lazy>"] = cell("<lazy>", "z = 3\n")  # read in place, before the last name sent
    assert sorted(sources()) == ["<cell 2>", "<lazy>"]
    del cache["<cell 1>"]
    cache["<cell 1>"] = cell("<cell 1>")  # dropped and read again: the workers have it
    assert sources() == []
    del cache["<cell 1>"]  # the last name sent is gone: every name is looked at again
    cache["<cell 3>"] = cell("<cell 3>")
    cache["<cell 4>"] = cell("<cell 4>")
    assert sources() == ["<cell 3>", "<cell 4>"]
    monkeypatch.setattr(payload, "_MAX_SOURCE_BYTES", 10)
    cache["<cell 5>"], cache["<cell 6>"] = cell("<cell 5>", "a = 1234\n"), cell("<cell 6>", "b = 5678\n")
    assert sources() == ["<cell 5>"]  # over the budget: the next payload's
    assert sources() == ["<cell 6>"]
    assert sources() == []
