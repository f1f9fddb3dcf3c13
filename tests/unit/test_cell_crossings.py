"""What crosses between the notebook and the workers, without processes: rank-bound objects are
refused wherever they sit, the ledger tells snapshots from the notebook's own values, and a pool
cell sends only what the workers lack (or what it must, said)."""

from __future__ import annotations

import threading
import types

import pytest
import torch

from magics.cell import crossings
from magics.cell.ledger import NameLedger
from magics.cell.shipping import UnshippableNamesError, collect_names
from notebook_accel import Accelerator
from notebook_accel.launch import check_sendable, dumps_result, serialise_payload


def _double(config):
    return config


def test_the_launcher_refuses_a_rank_bound_object_anywhere_in_the_payload_naming_its_path():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(TypeError, match=r"cannot send args\[0\]\['run'\]\.acc to the workers: it is "
                                        r"an Accelerator, which belongs to one process"):
        serialise_payload(_double, ({"run": types.SimpleNamespace(acc=accelerator)},), {})
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match=r"kwargs\['opt'\] to the workers: it is a prepared optimizer"):
        serialise_payload(_double, (), {"opt": optimizer})
    assert check_sendable({"model": model, "lr": 0.1}) is None  # a plain module travels
    assert check_sendable([1, {"a": accelerator}]) == "an Accelerator (at [1]['a'])"
    with pytest.raises(TypeError):  # a value that cannot be pickled cannot be sent at all
        check_sendable(threading.Lock())
    # what comes back from a worker may hold one: the notebook may look at it
    assert dumps_result({"accelerator": accelerator})


def test_the_ledger_tells_a_snapshot_from_the_notebooks_own_value():
    ledger = NameLedger()
    model, steps = torch.nn.Linear(1, 1), 3
    ledger.record_pulled({"model": model, "steps": steps}, cell=5, on_pool=True)
    assert ledger.snapshot("model", model).cell == 5
    assert ledger.snapshot("model", torch.nn.Linear(1, 1)) is None  # reassigned in the notebook
    assert ledger.matches_workers("steps", 3) and not ledger.matches_workers("steps", 4)
    assert set(ledger.snapshots({"model": model, "steps": 4})) == {"model"}
    ledger.record_pulled({"steps": 9}, cell=6, on_pool=False)  # from fresh workers
    assert not ledger.matches_workers("steps", 9)


def test_collect_names_refuses_rank_0s_accelerator_naming_the_cell_it_came_from():
    ledger = NameLedger()
    accelerator = Accelerator(cpu=True)
    ledger.record_pulled({"accelerator": accelerator}, cell=7, on_pool=True)
    with pytest.raises(UnshippableNamesError) as refused:
        collect_names(["accelerator", "built_here"],
                      {"accelerator": accelerator, "built_here": Accelerator(cpu=True)}, ledger=ledger)
    reasons = refused.value.reasons
    assert reasons["accelerator"].startswith("rank 0's copy of an Accelerator, brought back by "
                                             "cell [7]")
    assert "run the cell that builds it (In [7]) again" in reasons["accelerator"]
    assert reasons["built_here"].startswith("an Accelerator, made in the notebook")


def _notebook_function(source: str, name: str):
    scope = {"__name__": "__main__"}
    exec(source, scope)  # noqa: S102 - a notebook cell
    return scope[name]


def test_a_pool_cell_sends_what_the_workers_lack_and_says_what_it_keeps_or_replaces():
    ledger = NameLedger()
    old_scale = _notebook_function("def scale(x):\n    return x", "scale")
    ledger.record_sent({"lr": 0.5, "scale": old_scale, "data": [1]}, cell=2, on_pool=True)
    namespace = {"lr": 0.25, "scale": _notebook_function("def scale(x):\n    return 2 * x", "scale"),
                 "data": [1], "new": 1, "torch": torch, "theirs": "notebook"}  # data: a new list
    chosen = crossings.choose(["lr", "scale", "new", "torch", "theirs", "mine"], namespace, ledger,
                              on_workers=["lr", "scale", "data", "torch", "theirs", "mine"],
                              copies=["lr", "scale", "data"])
    assert chosen.send == ["scale", "new"]
    assert chosen.replace == chosen.redefined == ["scale"]
    assert chosen.kept == ["lr", "theirs"]  # the notebook's differ: said, not sent
    pushed = crossings.choose(["lr"], namespace, ledger, on_workers=["lr", "data"], copies=["lr"],
                              push=["lr", "data"])
    assert pushed.send == pushed.replace == ["lr", "data"]
    notice = crossings.kept_notice(chosen)
    assert notice.startswith("[notebook_accel] the workers keep their own lr, theirs")
    assert "--push lr,theirs sends them" in notice


def test_the_summary_names_what_crossed_and_marks_snapshots_and_rank_bound_ones():
    ledger = NameLedger()
    model = torch.nn.Linear(1, 1)
    ledger.record_pulled({"model": model}, cell=3, on_pool=True)
    line = crossings.summary({"model": model, "torch": torch, "lr": 0.1},
                             {"accelerator": Accelerator(cpu=True), "steps": 2, "os": types},
                             crossings.Crossing(), on_pool=True, ledger=ledger)
    assert line == ("[notebook_accel] sent from the notebook: model (rank 0's copy from cell [3]), "
                    "lr · back from rank 0: accelerator, steps (copies: the live objects stay on "
                    "the workers; accelerator: rank 0's, to look at here; never sent to the workers)")
    assert crossings.summary({}, {}, crossings.Crossing(), on_pool=False, ledger=ledger) is None
