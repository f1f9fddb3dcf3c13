import pytest

from tests.kernel_harness import Kernel, wait_no_workers


@pytest.fixture(autouse=True)
def no_worker_left_behind():
    """Every test must end with no worker process left anywhere on the machine."""
    yield
    left = wait_no_workers(timeout=8.0)
    for proc in left:
        proc.kill()
    assert not left, f"worker processes left behind: {[(p.pid, p.name()) for p in left]}"


@pytest.fixture(scope="module")
def kernel():
    """A real IPython kernel shared by the tests of one module."""
    k = Kernel()
    k.ok("import torch, torch.distributed as dist\nfrom notebook_accel import notebook_launcher, WorkerError")
    yield k
    k.shutdown()


@pytest.fixture
def fresh_kernel():
    k = Kernel()
    yield k
    k.shutdown()
