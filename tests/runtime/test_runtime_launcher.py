"""The runtime inside workers started by ``notebook_launcher``, and the same code under ``torchrun``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.utils.data import DataLoader

from notebook_accel import Accelerator, WorkerError, notebook_launcher
from notebook_accel.launch import launcher
from notebook_accel.launch.backends import Backend, WorkerGroup, WorkerHandle
from notebook_accel.launch.backends.processes import ProcessBackend
from tests.runtime_scripts import same_code
from tests.runtime_support import torchrun

pytestmark = pytest.mark.slow


def test_an_accelerator_in_the_parent_does_not_stop_a_launch():
    Accelerator()  # as in a kernel that made one first: no process group may exist afterwards
    assert not dist.is_initialized()
    results = notebook_launcher(same_code.train, args=(4, 2, False), num_processes=2, return_all=True)
    assert [r["world"] for r in results] == [2, 2] and results[0]["type"] == "MULTI_CPU"
    assert torch.equal(results[0]["weights"], results[1]["weights"])  # DDP kept the ranks in step


def test_same_function_under_notebook_launcher_and_torchrun_is_bit_identical(tmp_path: Path):
    launched = notebook_launcher(same_code.train, num_processes=2, mixed_precision="no", return_all=True)
    torchrun(Path(same_code.__file__), tmp_path, None)
    by_torchrun = [torch.load(tmp_path / f"same_code_rank{r}.pt", weights_only=True) for r in range(2)]
    for ours, theirs in zip(launched, by_torchrun, strict=True):
        assert torch.equal(ours["weights"], theirs["weights"])
        assert (ours["world"], ours["type"]) == (theirs["world"], theirs["type"]) == (2, "MULTI_CPU")


def test_launcher_mixed_precision_reaches_the_accelerator():
    results = notebook_launcher(same_code.train, args=(8, 1, False), num_processes=2, mixed_precision="bf16",
                                return_all=True)
    assert [r["mp"] for r in results] == ["bf16", "bf16"]


def _threads() -> tuple[str | None, int]:
    return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()


def test_workers_get_omp_num_threads_as_torchrun_gives_it_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = notebook_launcher(_threads, num_processes=2, return_all=True)
    assert threads[0] == threads[1] and threads[0][0] == str(threads[0][1])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert notebook_launcher(_threads, num_processes=2, return_all=True) == [("1", 1)] * 2


def test_two_workers_match_one_process_reference():
    results = notebook_launcher(same_code.train, args=(4, 2, False, 0.0), num_processes=2, return_all=True)
    ref = same_code.model(dropout=0.0)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        for x, y in DataLoader(same_code.data(), batch_size=16):  # 2 workers x 4 x 2 accumulation steps
            opt.zero_grad()
            torch.nn.functional.mse_loss(ref(x), y).backward()
            opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    for r in results:
        assert (r["weights"] - expected).abs().max() < 1e-5


# ---- the launcher seam: the kernel side reaches workers only through a backend's interface ----

class _OnlyTheInterface(WorkerHandle):
    """A handle offering nothing but :class:`WorkerHandle`'s members (no process to reach into)."""

    def __init__(self, inner: WorkerHandle) -> None:
        self._inner, self.rank = inner, inner.rank
        self.stdout_fd, self.stderr_fd = inner.stdout_fd, inner.stderr_fd
        self.control_fd, self.events_fd = inner.control_fd, inner.events_fd
        self.calls: list[str] = []

    pid = property(lambda self: self._inner.pid)
    sentinel = property(lambda self: self._inner.sentinel)
    exitcode = property(lambda self: self._inner.exitcode)

    def terminate(self) -> None:
        self.calls.append("terminate")
        self._inner.terminate()

    def kill(self) -> None:
        self.calls.append("kill")
        self._inner.kill()

    def dump_stacks(self) -> None:
        self._inner.dump_stacks()

    def reap(self, timeout: float) -> None:
        self._inner.reap(timeout)


class _Group(WorkerGroup):
    def __init__(self, inner: WorkerGroup) -> None:
        super().__init__(inner.plan, [_OnlyTheInterface(h) for h in inner.handles])
        self.inner, self.closed = inner, False

    def close(self) -> None:
        self.closed = True
        self.inner.close()


class _Backend(Backend):
    """Another backend, as a warm pool or a cluster would be one: it only starts and hands back."""

    def __init__(self) -> None:
        self.groups: list[_Group] = []

    def start(self, plan, payload) -> _Group:
        self.groups.append(_Group(ProcessBackend().start(plan, payload)))
        return self.groups[-1]


def _rank() -> int:
    return int(os.environ["RANK"])


def _rank_1_fails() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 gives up")
    time.sleep(60)  # stopped by the supervisor, through the handle


def test_a_backend_hands_back_handles_and_the_shared_path_does_the_rest(monkeypatch):
    backend = _Backend()
    monkeypatch.setattr(launcher, "backend_for", lambda plan: backend)
    assert notebook_launcher(_rank, num_processes=2, return_all=True) == [0, 1]
    with pytest.raises(WorkerError, match="rank 1 failed: ValueError: rank 1 gives up") as caught:
        notebook_launcher(_rank_1_fails, num_processes=2)
    assert caught.value.rank == 1
    assert [group.closed for group in backend.groups] == [True, True]
    stopped = backend.groups[1].handles[0]  # rank 0, still sleeping when rank 1 failed
    assert stopped.calls[0] == "terminate"


def test_except_child_failed_error_catches_a_failed_launch_as_with_the_peer():
    """Code written for the peer catches torch elastic's ChildFailedError around notebook_launcher."""
    try:
        notebook_launcher(_rank_1_fails, num_processes=2)
    except ChildFailedError as error:
        caught = error
    else:
        raise AssertionError("the launch did not fail")
    assert isinstance(caught, WorkerError) and caught.rank == 1
    assert "ValueError: rank 1 gives up" in str(caught)
    assert caught.failures[1].pid is not None and "rank 1 gives up" in caught.failures[1].message
    assert caught.get_first_failure()[0] == 1
