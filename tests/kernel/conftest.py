"""The tests that drive a real Jupyter kernel (tests/kernel_harness)."""

from __future__ import annotations

import pytest

from tests.config_isolation import isolate_config
from tests.kernel_harness import Kernel


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A real IPython kernel shared by the tests of one module, with config dirs of its own."""
    with pytest.MonkeyPatch.context() as env:
        isolate_config(env, tmp_path_factory.mktemp("kernel"))
        k = Kernel()
    k.ok("import torch, torch.distributed as dist\nfrom notebook_accel import notebook_launcher, WorkerError")
    yield k
    k.shutdown()


@pytest.fixture
def fresh_kernel():
    """A kernel of this test's own (it sees the test's config dirs)."""
    k = Kernel()
    yield k
    k.shutdown()
