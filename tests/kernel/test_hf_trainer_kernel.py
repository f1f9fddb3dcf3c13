"""transformers' Trainer under ``notebook_launcher`` from a real kernel: a clean cell.

The Trainer's notebook progress (HTML displays) is shown for rank 0 only; rank 1's
displays, whose only text is ``<IPython.core.display.HTML object>``, are counted in
the live view, never printed; workers get ``OMP_NUM_THREADS`` as under torchrun, so
the peer's "OMP_NUM_THREADS/MKL_NUM_THREADS unset" warning does not appear.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

JOB = """
from notebook_accel import notebook_launcher

def train(out):
    import os, torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64,
                                       n_positions=16, bos_token_id=0, eos_token_id=0))
    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.randint(0, 64, (8,))}
            for _ in range(16)]
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=4,
                             report_to=[], logging_steps=1, save_strategy="no", use_cpu=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    return trainer.train().training_loss, trainer.args.world_size, os.environ["OMP_NUM_THREADS"]
"""


def test_trainer_on_two_processes_leaves_a_clean_cell(kernel, tmp_path):
    kernel.ok(JOB)
    result = kernel.ok(f"loss, world, threads = notebook_launcher(train, args=({str(tmp_path)!r},), "
                       "num_processes=2)\nprint('world', world, 'threads', threads)", timeout=240)
    text = result.stdout + result.stderr
    assert "world 2 threads " in text, text
    assert "object>" not in text, text
    assert "OMP_NUM_THREADS/MKL_NUM_THREADS unset" not in text, text
    rich = [m["content"]["data"] for m in result.outputs
            if m["msg_type"] in ("display_data", "update_display_data")]
    assert any("<table" in d.get("text/html", "") and "Step" in d.get("text/html", "")
               for d in rich), "rank 0's notebook progress is missing"
    live = [d["text/plain"] for d in rich if "notebook_accel:" in d.get("text/plain", "")]
    assert "rank 1 displayed" in live[-1], live[-1]
