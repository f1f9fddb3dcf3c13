"""The tests that drive a real Jupyter kernel (tests/kernel_harness)."""

from __future__ import annotations

import pytest

from tests.config_isolation import isolate_config
from tests.kernel_harness import Kernel


@pytest.fixture(scope="module")
def module_config_dirs(tmp_path_factory):
    """Config dirs of one module's own, for what outlives a test (a module's kernel); each
    test still gets its own on top (tests/conftest.py)."""
    with pytest.MonkeyPatch.context() as env:
        isolate_config(env, tmp_path_factory.mktemp("config"))
        yield


@pytest.fixture(scope="module")
def kernel(module_config_dirs):
    """A real IPython kernel shared by the tests of one module."""
    k = Kernel()
    k.ok("import torch, torch.distributed as dist\nfrom notebook_accel import notebook_launcher, WorkerError")
    yield k
    k.shutdown()


@pytest.fixture(scope="module")
def magic_kernel(module_config_dirs):
    """A real kernel with the magics loaded (``%load_ext notebook_accel``), shared by the tests
    of one module, in order (its pool, once started, lives across them)."""
    k = Kernel()
    k.ok("%load_ext notebook_accel")
    yield k
    k.shutdown()


@pytest.fixture
def fresh_kernel():
    """A kernel of this test's own (it sees the test's config dirs)."""
    k = Kernel()
    yield k
    k.shutdown()
