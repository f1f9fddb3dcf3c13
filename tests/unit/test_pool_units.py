"""The warm pool's pieces without processes: a worker's namespace, and when the group is distrusted."""

from __future__ import annotations

import types

import pytest

from notebook_accel.launch.worker import namespace
from notebook_accel.wire import RunDone


@pytest.fixture(autouse=True)
def empty_namespace():
    saved, copies = dict(namespace.NAMESPACE), dict(namespace._COPIES)
    namespace.NAMESPACE.clear()
    namespace._COPIES.clear()
    yield
    namespace.NAMESPACE.clear()
    namespace.NAMESPACE.update(saved)
    namespace._COPIES.clear()
    namespace._COPIES.update(copies)


def test_the_workers_names_win_whatever_their_origin():
    with namespace.worker_scope({"lr": 0.1, "weights": [0.0]}) as scope:
        exec("model = 'prepared'\nseen = lr\nweights[0] += 1", scope)  # noqa: S102 - a cell
    assert namespace.names() == ("lr", "model", "seen", "weights")
    assert namespace.copies() == ("lr", "weights")  # sent by the notebook, not assigned here
    notebook = {"lr": 0.5, "model": "the notebook's copy", "weights": [0.0]}
    with namespace.worker_scope(notebook) as scope:
        exec("seen = (lr, model, weights[0])\nlr = 0.01", scope)  # noqa: S102
    # neither a name a run assigned nor one sent earlier is replaced: the in-place change stays
    assert scope["seen"] == (0.1, "prepared", 1.0)
    assert namespace.copies() == ("weights",)  # lr was assigned by the run: the worker's own
    with namespace.worker_scope({"lr": 0.7}, replace=["lr"]) as scope:  # asked for by name
        exec("seen = lr", scope)  # noqa: S102
    assert scope["seen"] == 0.7


def test_imported_names_are_told_apart_from_state():
    with namespace.worker_scope({}) as scope:
        exec("import os\nfrom collections import OrderedDict\nclass Mine: pass\n"  # noqa: S102
             "def helper(): pass\nsteps = 3", scope)
    assert namespace.imported() == ("OrderedDict", "os")
    assert set(namespace.names()) - set(namespace.imported()) == {"Mine", "helper", "steps"}


def test_names_leave_out_only_the_dunders_and_imported_ones_follow_their_order():
    names = ["__name__", "__", "_", "_private", "__init__", "_`", "^up", "Z", "a", "__x__", "_a"]
    namespace.NAMESPACE.update(dict.fromkeys(names, 0))
    assert namespace.names() == tuple(sorted(n for n in names if not n.startswith("__")))
    with namespace.worker_scope({}) as scope:
        exec("import os, sys as _sys\ndef own(): pass\nfrom json import dumps", scope)  # noqa: S102
    living = namespace.names()
    assert namespace.imported(living) == namespace.imported() == ("_sys", "dumps", "os")


def test_names_assigned_before_an_exception_stay_and_deleted_names_go():
    with pytest.raises(ZeroDivisionError), namespace.worker_scope({}) as scope:
        exec("kept = 1\n1 / 0", scope)  # noqa: S102
    assert "kept" in namespace.names()
    with namespace.worker_scope({}) as scope:
        exec("del kept", scope)  # noqa: S102
    assert "kept" not in namespace.names()


def test_bind_runs_notebook_functions_in_the_namespace_and_leaves_imported_ones():
    scope = {"__name__": "__main__"}
    exec("def remember(x):\n    global last\n    last = x\n    return x", scope)  # noqa: S102
    by_value = types.FunctionType(scope["remember"].__code__, dict(scope), "remember")
    assert namespace.bind(by_value)(3) == 3 and namespace.NAMESPACE["last"] == 3
    assert namespace.bind(len) is len and namespace.bind(namespace.names) is namespace.names


def test_bind_sends_the_notebooks_newest_code_but_keeps_the_workers_data():
    def defined(source: str) -> dict:
        scope = {"__name__": "__main__"}
        exec(source, scope)  # noqa: S102 - a notebook cell
        return scope

    first = defined("lr = 0.1\ndef scale(x):\n    return x * 2\ndef run():\n    return scale(lr)")
    run = types.FunctionType(first["run"].__code__, dict(first), "run")
    assert namespace.bind(run)() == 0.2
    second = defined("lr = 0.5\ndef scale(x):\n    return x * 3\ndef run():\n    return scale(lr)")
    run = types.FunctionType(second["run"].__code__, dict(second), "run")
    assert namespace.bind(run)() == pytest.approx(0.3)  # the new scale, the workers' lr


class _Handle:
    def __init__(self, rank: int, report: RunDone | None, exitcode: int | None = None) -> None:
        self.rank, self.last_report, self.exitcode = rank, report, exitcode


class _Workers:
    def __init__(self, *handles: _Handle) -> None:
        self.handles = list(handles)

    def dead(self):
        return [h for h in self.handles if h.exitcode is not None]


@pytest.mark.parametrize(("reports", "ended", "reason"), [
    ((RunDone(4, False), RunDone(4, False)), "failed", None),
    ((RunDone(None, False), RunDone(None, False)), "failed", None),
    ((RunDone(4, False), RunDone(5, False)), "finished", "disagree (collectives issued: 4, 5)"),
    ((RunDone(4, True), RunDone(4, False)), "failed", "inside a collective on rank 0"),
    ((RunDone(4, False), None), "failed", "did not end its run"),
    ((RunDone(-1, False), RunDone(-1, False)), "failed", "cannot be checked"),
    ((RunDone(-1, False), RunDone(-1, False)), "finished", None),
])
def test_the_group_is_distrusted_exactly_when_it_could_pair_collectives_wrongly(reports, ended, reason):
    from notebook_accel.launch.pools.recovery import distrust as _distrust

    workers = _Workers(*(_Handle(rank, report) for rank, report in enumerate(reports)))
    found = _distrust(workers, ended)
    assert (found is None) if reason is None else (reason in found), found
    workers.handles[1].exitcode = -9
    assert _distrust(workers, ended) == "rank 1 was killed by SIGKILL"
    # after the stop button, the kill was ours: said as such, not as a death from outside
    said = _distrust(workers, "interrupted")
    assert said.startswith("rank 1 did not stop within 1.5 s of the interrupt") and "SIGKILL" not in said
