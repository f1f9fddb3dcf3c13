"""find_executable_batch_size and release_memory (the peer's accelerate.utils.memory names); LocalSGD alone."""

from __future__ import annotations

import pytest
import torch


def test_local_sgd_is_off_for_one_process_and_refused_beyond_ddp():
    from types import SimpleNamespace

    from notebook_accel import Accelerator, DistributedType
    from notebook_accel.local_sgd import LocalSGD

    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    with LocalSGD(accelerator, model, local_sgd_steps=2) as local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled and local_sgd.num_steps == 1
    with pytest.raises(NotImplementedError, match="DeepSpeed"):
        LocalSGD(SimpleNamespace(distributed_type=DistributedType.DEEPSPEED), model, 2)
