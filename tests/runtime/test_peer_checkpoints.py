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


# A mid-epoch checkpoint of a whole training job, each library in an interpreter of its own:
# weights, AdamW state (moments and its step), the scheduler, accelerator.step, an object given to
# register_for_checkpointing, and a StatefulDataLoader's position (torchdata's dl_state_dict.bin).
MID_EPOCH_JOB = '''
import json, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from {library} import Accelerator
from {library}.utils import DataLoaderConfiguration
from torchdata.stateful_dataloader import StatefulDataLoader

class Counter:
    def __init__(self):
        self.seen = 0
    def state_dict(self):
        return {{"seen": self.seen}}
    def load_state_dict(self, state):
        self.seen = state["seen"]

def build(seed):
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    torch.manual_seed(seed)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = DataLoader(TensorDataset(torch.arange(40.0).reshape(20, 2)), batch_size=2)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    assert isinstance(loader, StatefulDataLoader), type(loader).__mro__
    return accelerator, model, optimizer, scheduler, loader, counter

def train_step(model, optimizer, scheduler, counter, x):
    model(x).sum().backward()
    optimizer.step(); scheduler.step(); optimizer.zero_grad()
    counter.seen += len(x)

def summary(accelerator, model, optimizer, scheduler, counter, rest):
    state = optimizer.state_dict()["state"]
    return {{"weights": [p.tolist() for p in accelerator.unwrap_model(model).parameters()],
             "moments": [[s["exp_avg"].tolist(), s["exp_avg_sq"].tolist()] for s in state.values()],
             "adam_steps": [float(s["step"]) for s in state.values()],
             "scheduler": [scheduler.scheduler.last_epoch if hasattr(scheduler, "scheduler") else scheduler.last_epoch,
                           scheduler.get_last_lr()],
             "step": accelerator.step, "seen": counter.seen, "rest": rest}}

def save(directory):
    accelerator, model, optimizer, scheduler, loader, counter = build(0)
    rest = []
    for i, (x,) in enumerate(loader):
        if i < 4:
            train_step(model, optimizer, scheduler, counter, x)
            if i == 3:
                accelerator.step = 11
                accelerator.save_state(directory)
                saved = summary(accelerator, model, optimizer, scheduler, counter, None)
        else:
            rest.append(x[:, 0].tolist())
    return saved | {{"rest": rest}}

def load(directory):
    accelerator, model, optimizer, scheduler, loader, counter = build(1)
    accelerator.load_state(directory)
    rest = [x[:, 0].tolist() for (x,) in loader]
    return summary(accelerator, model, optimizer, scheduler, counter, rest)

print(json.dumps(globals()[sys.argv[1]](sys.argv[2])))
'''


def _job(library: str, action: str, directory) -> dict:
    """``action`` ("save" / "load") of ``MID_EPOCH_JOB`` on ``library``, in a fresh interpreter (ours
    from this checkout; the peer's as installed, with nothing of ours on the path)."""
    from pathlib import Path

    env = {"PATH": "/usr/bin:/bin", "HOME": str(directory.parent), "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    if library == "notebook_accel":
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    code = MID_EPOCH_JOB.format(library=library)
    done = subprocess.run([sys.executable, "-c", code, action, str(directory)], capture_output=True, text=True,
                          timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(importlib.util.find_spec("torchdata") is None, reason="torchdata is absent (the stateful extra)")
@pytest.mark.parametrize(("writer", "reader"), [("accelerate", "notebook_accel"), ("notebook_accel", "accelerate")],
                         ids=["peer-to-ours", "ours-to-peer"])
def test_a_mid_epoch_checkpoint_resumes_in_the_other_library(tmp_path, writer, reader):
    saved = _job(writer, "save", tmp_path / "ckpt")
    files = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "dl_state_dict.bin", "random_states_0.pkl",
            "custom_checkpoint_0.pkl"} <= files, files
    loaded = _job(reader, "load", tmp_path / "ckpt")
    assert loaded == saved  # weights, optimizer, scheduler, step, the registered object, the epoch's rest
    assert saved["rest"] == [[4.0 * i, 4.0 * i + 2] for i in range(4, 10)]  # batches 4-9: resumed after the 4th
    assert saved["adam_steps"] == [4.0, 4.0] and saved["seen"] == 8 and saved["step"] == 11


# A seedable, shuffled loader checkpointed by the peer in its second epoch, loaded by a plain loader of ours:
# its sampler.bin (written as its save_accelerator_state writes one: its own `save` of the pickled
# SeedableRandomSampler, which its save_state does only for an IterableDatasetShard's loader) gives the
# seed and epoch, its dl_state_dict.bin (torchdata's state) the batches done; the rest of the epoch and the
# next epoch come out as in the peer.
PEER_SAMPLER_JOB = '''
import json, sys
from pathlib import Path
import torch
from torch.utils.data import DataLoader
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, save, set_seed

directory = Path(sys.argv[1])
set_seed(13)
accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
    use_stateful_dataloader=True, use_seedable_sampler=True))
loader = accelerator.prepare(DataLoader(list(range(20)), batch_size=2, shuffle=True))
first = [b.tolist() for b in loader]
rest, second = [], None
for i, batch in enumerate(loader):
    if i == 4:
        accelerator.save_state(directory)
        save(loader.get_sampler(), directory / "sampler.bin", safe_serialization=False)
    if i > 4:
        rest.append(batch.tolist())
third = [b.tolist() for b in loader]
print(json.dumps({"first": first, "rest": rest, "third": third}))
'''


@pytest.mark.skipif(importlib.util.find_spec("torchdata") is None, reason="torchdata is absent (the stateful extra)")
def test_a_plain_loader_continues_the_epoch_of_the_peers_checkpoint(tmp_path):
    from torch.utils.data import DataLoader

    from notebook_accel.data_loader import skip_first_batches
    from notebook_accel.utils import DataLoaderConfiguration

    done = subprocess.run([sys.executable, "-c", PEER_SAMPLER_JOB, str(tmp_path / "ckpt")], capture_output=True,
                          text=True, timeout=240, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                                       "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    peer = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"dl_state_dict.bin", "sampler.bin"} <= {p.name for p in (tmp_path / "ckpt").iterdir()}

    state = torch.get_rng_state()
    try:
        torch.manual_seed(99)  # another seed than the peer's: the sampler's comes from sampler.bin
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
        loader = accelerator.prepare(DataLoader(list(range(20)), batch_size=2, shuffle=True))
        accelerator.load_state(tmp_path / "ckpt")
    finally:
        torch.set_rng_state(state)
    assert loader.resume_step == 5  # the peer's torchdata state (5 batches given), read by a plain loader
    rest = [b.tolist() for b in skip_first_batches(loader)]
    assert rest == peer["rest"] != peer["first"][5:]  # the second epoch's own order, from its 6th batch
    assert [b.tolist() for b in loader] == peer["third"]
