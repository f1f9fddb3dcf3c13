"""The warm pool's pieces without processes: a worker's namespace, and when the group is distrusted."""

from __future__ import annotations

import types

import pytest

from notebook_accel.launch.worker import namespace
from notebook_accel.wire import RunDone


@pytest.fixture(autouse=True)
def empty_namespace():
    saved, copies = dict(namespace.NAMESPACE), set(namespace._COPIES)
    namespace.NAMESPACE.clear()
    namespace._COPIES.clear()
    yield
    namespace.NAMESPACE.clear()
    namespace.NAMESPACE.update(saved)
    namespace._COPIES.clear()
    namespace._COPIES.update(copies)


def test_assigned_names_are_the_workers_own_and_copies_are_refreshed():
    with namespace.worker_scope({"lr": 0.1}) as scope:
        exec("model = 'prepared'\nseen = lr", scope)  # noqa: S102 - a cell
    assert namespace.names() == ("model", "seen")  # lr is the notebook's copy, not listed
    with namespace.worker_scope({"lr": 0.5, "model": "the notebook's copy"}) as scope:
        exec("seen = (lr, model)", scope)  # noqa: S102
    assert scope["seen"] == (0.5, "prepared")  # the copy refreshed; the worker's own name kept


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


class _Handle:
    def __init__(self, rank: int, report: RunDone | None, exitcode: int | None = None) -> None:
        self.rank, self.last_report, self.exitcode = rank, report, exitcode


class _Workers:
    def __init__(self, *handles: _Handle) -> None:
        self.handles = list(handles)

    def dead(self):
        return [h for h in self.handles if h.exitcode is not None]


@pytest.mark.parametrize(("reports", "failed", "reason"), [
    ((RunDone(4, False), RunDone(4, False)), True, None),
    ((RunDone(None, False), RunDone(None, False)), True, None),
    ((RunDone(4, False), RunDone(5, False)), False, "disagree (collectives issued: 4, 5)"),
    ((RunDone(4, True), RunDone(4, False)), True, "inside a collective on rank 0"),
    ((RunDone(4, False), None), True, "did not end its run"),
    ((RunDone(-1, False), RunDone(-1, False)), True, "cannot be checked"),
    ((RunDone(-1, False), RunDone(-1, False)), False, None),
])
def test_the_group_is_distrusted_exactly_when_it_could_pair_collectives_wrongly(reports, failed, reason):
    from notebook_accel.launch.pool import _distrust

    workers = _Workers(*(_Handle(rank, report) for rank, report in enumerate(reports)))
    found = _distrust(workers, failed)
    assert (found is None) if reason is None else (reason in found), found
    workers.handles[1].exitcode = -9
    assert _distrust(workers, failed) == "rank 1 was killed by SIGKILL"
