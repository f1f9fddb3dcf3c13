"""The peer's ``examples/by_feature`` scripts run on 2 processes (gloo, CPU) against notebook_accel.

Started by our ``notebook_launcher``; DeepSpeed's by ``notebook-accel launch --config-file``
with the peer's config format, as its README starts it with ``accelerate launch``.

Each script runs unchanged but for its data loading (``tests/peer_shim/stand_ins.py``:
synthetic GLUE MRPC / wikitext, a local tokenizer, tiny models from configs, nothing
downloaded), importing ``accelerate`` from ``tests/peer_shim``; every rank checks that
the real accelerate was never imported. The scripts are copied at test time from the
peer's git repository (``NOTEBOOK_ACCEL_PEER_REPO`` or the default mirror); without
it the tests skip, saying so. ``python tests/peer_shim/peer_examples.py [NAME...]``
runs them by hand. Megatron-LM's example is out of scope (it needs Megatron and GPUs).
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.peer_shim import peer_examples

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    repo = peer_examples.peer_repo()
    if repo is None:
        pytest.skip(peer_examples.missing_reason())
    path = tmp_path_factory.mktemp("peer_examples")
    peer_examples.copy_examples(repo, path)
    return path


@pytest.mark.parametrize("name", peer_examples.EXAMPLES)
def test_peer_example_runs_on_two_processes(work, name):
    example = peer_examples.EXAMPLES[name]
    if example.missing():
        pytest.skip(f"{name} needs {example.missing()} (pip install -e '.[bench,clients,deepspeed]')")
    result = peer_examples.run_example(name, work)
    assert result["returncode"] == 0, peer_examples.failure(result)
    assert [r["rank"] for r in result["ranks"]] == [0, 1], result["output"][-3000:]
    for report in result["ranks"]:
        assert report["finished"], report
        assert report["shim"].endswith("peer_shim/accelerate/__init__.py")
        assert report["leaked"] == [], "the real accelerate was imported"
    output = result["output"]
    first, *others = example.prints
    assert len(re.findall(first, output)) == example.repeats, output[-3000:]  # rank 0 only, once per epoch
    for line in others:
        assert re.search(line, output), f"{line!r} not printed:\n{output[-3000:]}"
    out = work / "runs" / name
    for pattern in example.files:
        assert list(out.glob(pattern)), f"{name} wrote no {pattern} in {out}"


def _weights(folder):
    """The model weights ``save_state`` wrote in ``folder`` (whatever its file format)."""
    from safetensors.torch import load_file

    path = next(folder.glob("model.*"))
    return load_file(path) if path.suffix == ".safetensors" else torch.load(path, map_location="cpu")


def test_checkpointing_example_resumes_where_it_stopped(work):
    if peer_examples.EXAMPLES["checkpointing"].missing():
        pytest.skip(f"needs {peer_examples.EXAMPLES['checkpointing'].missing()}")
    # As the peer's own tests do (test_examples.py, test_load_states_by_epoch), and more: the run
    # resumed from epoch 1's checkpoint trains epoch 2 only, and lands bit for bit on the weights
    # of the uninterrupted run (model, optimizer, scheduler, RNG and sampler states restored).
    first = work / "runs" / "checkpointing"
    if not (first / "epoch_2").is_dir():
        assert peer_examples.run_example("checkpointing", work)["returncode"] == 0
    result = peer_examples.run_example("checkpointing", work, run="checkpointing_resumed",
                                       extra=("--resume_from_checkpoint", str(first / "epoch_1")))
    assert result["returncode"] == 0, peer_examples.failure(result)
    output = result["output"]
    assert f"Resumed from checkpoint: {first / 'epoch_1'}" in output
    assert "epoch 0:" not in output and "epoch 1:" not in output and "epoch 2:" in output, output[-3000:]
    resumed, uninterrupted = _weights(work / "runs" / "checkpointing_resumed" / "epoch_2"), _weights(first / "epoch_2")
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)
    before = _weights(first / "epoch_1")  # epoch 2 did train: the comparison can fail
    assert not all(torch.equal(before[k], resumed[k]) for k in resumed)
