"""``save_state`` / ``load_state`` across libraries: a checkpoint the real peer (accelerate, the
``bench`` extra) writes loads in ours, and ours in the peer, with safetensors or ``.bin`` models:
weights, optimizer and scheduler state, the step and every RNG come back. The peer runs in its
own interpreter (its singletons stay out of this one)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from notebook_accel import Accelerator

pytestmark = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                reason="the peer (accelerate) is not installed: pip install -e .[bench]")

# the same job in either library: `Accelerator` is whichever the script imports
JOB = '''
import random, sys, json
import numpy as np, torch
from {library} import Accelerator

def job(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return model, optimizer, scheduler

def draws():
    return [random.random(), float(np.random.rand()), torch.rand(1).item()]

def summary(accelerator, model, optimizer, scheduler):
    unwrapped = accelerator.unwrap_model(model)
    return {{"weights": [p.tolist() for p in unwrapped.parameters()],
             "moments": [s["exp_avg"].tolist() for s in optimizer.state_dict()["state"].values()],
             "lr": scheduler.get_last_lr(), "step": accelerator.step, "draws": draws()}}

def save(directory, safe):
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = accelerator.prepare(*job())
    for _ in range(2):
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
    accelerator.step = 7
    accelerator.save_state(directory, safe_serialization=safe)
    return summary(accelerator, model, optimizer, scheduler)

def load(directory):
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = accelerator.prepare(*job(seed=1))
    model(torch.ones(1, 3)).sum().backward(); optimizer.step(); optimizer.zero_grad()  # state to be replaced
    random.seed(5); np.random.seed(5); torch.manual_seed(5)
    accelerator.load_state(directory)
    return summary(accelerator, model, optimizer, scheduler)
'''


def _ours():
    namespace: dict = {}
    exec(JOB.format(library="notebook_accel"), namespace)  # noqa: S102  (our side, in this process)
    return namespace


def _peer(action: str, directory, safe: bool = True) -> dict:
    call = f"save({str(directory)!r}, {safe})" if action == "save" else f"load({str(directory)!r})"
    code = JOB.format(library="accelerate") + f"\nprint(json.dumps({call}))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(directory.parent), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_a_checkpoint_the_peer_wrote_loads_in_ours(tmp_path, safe):
    saved = _peer("save", tmp_path / "ckpt", safe)
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        loaded = _ours()["load"](tmp_path / "ckpt")
    finally:
        random.setstate(state[0]), np.random.set_state(state[1]), torch.set_rng_state(state[2])
    assert saved == loaded


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_a_checkpoint_we_wrote_loads_in_the_peer(tmp_path, safe):
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        saved = _ours()["save"](tmp_path / "ckpt", safe)
    finally:
        random.setstate(state[0]), np.random.set_state(state[1]), torch.set_rng_state(state[2])
    assert (tmp_path / "ckpt" / ("model.safetensors" if safe else "pytorch_model.bin")).is_file()
    assert saved == _peer("load", tmp_path / "ckpt")


def test_our_accelerator_defaults_to_safetensors_as_the_peer():
    assert inspect.signature(Accelerator.save_state).parameters["safe_serialization"].default is True
