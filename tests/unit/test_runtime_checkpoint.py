"""save_state / load_state, atomicity, save_model and trackers in one plain process."""

from __future__ import annotations

import json
import os
import pickle
import random

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from notebook_accel import Accelerator, set_seed
from notebook_accel.checkpoint import training_state as ckpt
from notebook_accel.data.prepare import DataLoaderConfiguration


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("NOTEBOOK_ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION", "NOTEBOOK_ACCEL_DEVICE"):
        monkeypatch.delenv(name, raising=False)


def setup(mixed_precision: str = "no", stateful: bool = False):
    set_seed(0)
    acc = Accelerator(mixed_precision=mixed_precision,
                      dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 4, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True)
    return (acc, *acc.prepare(model, opt, loader, sched))


def train(acc, model, opt, sched, batches, save_at=None, path=None):
    """One pass; with ``save_at``, checkpoint after that many steps and return the RNG states then."""
    at_save = None
    for i, (x, y) in enumerate(batches):
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        sched.step()
        opt.zero_grad()
        if save_at == i + 1:
            acc.save_state(path)
            at_save = random.getstate(), torch.get_rng_state()
    return at_save


def weights(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize(("mid_epoch", "stateful"), [(False, False), (True, False), (True, True)])
def test_resume_reproduces_uninterrupted_run_bit_for_bit(tmp_path, mid_epoch, stateful):
    if stateful:
        pytest.importorskip("torchdata.stateful_dataloader")  # the stateful extra
    acc, model, opt, loader, sched = setup(stateful=stateful)
    at_save = train(acc, model, opt, sched, loader, save_at=None if mid_epoch else len(loader), path=tmp_path / "ck")
    at_save = train(acc, model, opt, sched, loader, save_at=3 if mid_epoch else None, path=tmp_path / "ck") or at_save
    train(acc, model, opt, sched, loader)
    expected = weights(model)
    # a stateful loader's position is torchdata's, in the peer's file; a plain one's is ours
    assert {p.name for p in (tmp_path / "ck").iterdir()} >= ({"dl_state_dict.bin"} if stateful else {"dataloader.pt"})

    acc2, model2, opt2, loader2, sched2 = setup(stateful=stateful)
    torch.manual_seed(99)  # the load must restore every RNG, not rely on the seed
    acc2.load_state(tmp_path / "ck")
    assert random.getstate() == at_save[0] and torch.equal(torch.get_rng_state(), at_save[1])
    assert loader2.resume_step == (3 if mid_epoch else 0)
    # the rest of the interrupted epoch (or a whole one), then the last epoch
    by_hand = mid_epoch and not stateful  # stateful loaders resume by themselves
    train(acc2, model2, opt2, sched2, acc2.skip_first_batches(loader2) if by_hand else loader2)
    train(acc2, model2, opt2, sched2, loader2)
    assert torch.equal(weights(model2), expected)
    assert sched2.get_last_lr() == sched.get_last_lr()


def test_a_stateful_loader_given_a_plain_loaders_checkpoint_starts_its_epoch_over_with_a_warning(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    acc, model, opt, loader, sched = setup(stateful=False)
    train(acc, model, opt, sched, loader, save_at=3, path=tmp_path / "ck")
    acc2, model2, opt2, loader2, sched2 = setup(stateful=True)
    with pytest.warns(UserWarning, match="starts its epoch from the beginning"):
        acc2.load_state(tmp_path / "ck")
    assert loader2.resume_step == 0 and len(list(loader2)) == len(loader2)


def test_a_plain_loader_given_a_stateful_loaders_checkpoint_continues_its_epoch(tmp_path):
    """dl_state_dict.bin (torchdata's state, the peer's file) read by a plain loader: the batches done
    and, written by ours, the shuffle's generator, so the rest of the epoch is the one interrupted."""
    pytest.importorskip("torchdata.stateful_dataloader")
    acc, model, opt, loader, sched = setup(stateful=True)
    order = []
    for step, batch in enumerate(loader):
        order.append(batch[0].tolist())
        if step == 2:
            acc.save_state(tmp_path / "ck")
    acc2, model2, opt2, loader2, sched2 = setup(stateful=False)
    acc2.load_state(tmp_path / "ck")
    assert loader2.resume_step == 3
    assert [batch[0].tolist() for batch in acc2.skip_first_batches(loader2)] == order[3:]


def test_crash_inside_save_state_leaves_previous_checkpoint_loadable(tmp_path, monkeypatch):
    acc, model, opt, loader, sched = setup()
    train(acc, model, opt, sched, loader)
    acc.save_state(tmp_path / "ck")
    saved = weights(model)
    train(acc, model, opt, sched, loader)
    real_write = ckpt._write

    def crashing_write(obj, path, *how):
        if path.name == "optimizer.bin":
            raise OSError("disk full (injected)")
        real_write(obj, path, *how)

    monkeypatch.setattr(ckpt, "_write", crashing_write)
    with pytest.raises(OSError, match="injected"):
        acc.save_state(tmp_path / "ck")
    monkeypatch.setattr(ckpt, "_write", real_write)
    assert (tmp_path / "ck.tmp").exists()  # the half-written attempt, not the checkpoint
    acc.load_state(tmp_path / "ck")
    assert torch.equal(weights(model), saved)
    acc.save_state(tmp_path / "ck")  # a later save cleans up
    assert not (tmp_path / "ck.tmp").exists() and not (tmp_path / "ck.old").exists()


def test_crash_between_renames_falls_back_to_old_copy(tmp_path, monkeypatch):
    acc, model, opt, loader, sched = setup()
    acc.save_state(tmp_path / "ck")
    saved = weights(model)
    train(acc, model, opt, sched, loader)
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("power cut (injected)")
        real_rename(src, dst)

    monkeypatch.setattr(ckpt.os, "rename", rename)
    with pytest.raises(OSError, match="injected"):
        acc.save_state(tmp_path / "ck")
    monkeypatch.setattr(ckpt.os, "rename", real_rename)
    assert not (tmp_path / "ck").exists()
    with pytest.warns(UserWarning, match="interrupted save_state"):
        acc.load_state(tmp_path / "ck")
    assert torch.equal(weights(model), saved)


def test_checkpoint_files_load_with_weights_only(tmp_path):
    acc, *_ = setup("fp16")
    acc.save_state(tmp_path / "ck")
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == ["accelerator.pt", "dataloader.pt", "model.safetensors", "optimizer.bin", "random_states_0.pkl",
                     "scaler.pt", "scheduler.bin"]  # the peer's layout, plus our two
    for name in names:
        if name.endswith(".safetensors"):
            continue
        torch.load(tmp_path / "ck" / name, weights_only=True)


def test_untrusted_pickles_are_refused_by_default(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    acc, *_ = setup()
    acc.save_state(tmp_path / "ck", safe_serialization=False)
    with open(tmp_path / "ck" / "pytorch_model.bin", "wb") as f:
        pickle.dump(Evil(), f, protocol=2)
    with pytest.raises(pickle.UnpicklingError):
        acc.load_state(tmp_path / "ck")


def test_missing_directory_and_files_are_named(tmp_path):
    acc, *_ = setup()
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        acc.load_state(tmp_path / "nothing")
    acc.save_state(tmp_path / "ck")
    (tmp_path / "ck" / "scheduler.bin").unlink()
    with pytest.raises(FileNotFoundError, match="scheduler.bin"):
        acc.load_state(tmp_path / "ck")
    with pytest.raises(ValueError, match="project_dir"):
        acc.save_state()


def test_custom_objects_are_checkpointed(tmp_path):
    class Counter:
        def __init__(self):
            self.n = 0

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, state):
            self.n = state["n"]

    acc = Accelerator(project_dir=tmp_path)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    counter.n = 7
    acc.save_state()
    counter.n = 0
    acc.load_state()
    assert counter.n == 7
    with pytest.raises(ValueError, match="state_dict"):
        acc.register_for_checkpointing(object())


def test_save_and_save_model(tmp_path):
    acc, model, *_ = setup()
    path = acc.save_model(model, tmp_path / "out")
    assert path.name == "model.safetensors"
    from safetensors.torch import load_file

    loaded = load_file(path)
    assert all(torch.equal(loaded[k], v) for k, v in acc.unwrap_model(model).state_dict().items())
    bin_path = acc.save_model(model, tmp_path / "out", safe_serialization=False)
    assert torch.load(bin_path, weights_only=True).keys() == loaded.keys()
    acc.save({"x": torch.ones(2)}, tmp_path / "x.pt")
    assert torch.equal(torch.load(tmp_path / "x.pt", weights_only=True)["x"], torch.ones(2))
    acc.save({"x": torch.ones(2)}, tmp_path / "x.safetensors", safe_serialization=True)
    assert torch.equal(load_file(tmp_path / "x.safetensors")["x"], torch.ones(2))


def test_save_model_stores_tied_weights_once(tmp_path):
    from safetensors.torch import load_file

    acc = Accelerator()
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied, as in language models
    saved = load_file(acc.save_model(acc.prepare(model), tmp_path))
    assert list(saved) == ["0.weight"] and torch.equal(saved["0.weight"], model[0].weight)
    assert not list(tmp_path.glob("*.tmp"))


def test_jsonl_tracker_and_log(tmp_path):
    acc = Accelerator(log_with="jsonl", project_dir=tmp_path)
    acc.init_trackers("run", config={"lr": 0.1, "layers": torch.tensor(3)})
    acc.log({"loss": torch.tensor(0.5), "note": "ok"}, step=1)
    tracker = acc.get_tracker("jsonl")
    assert tracker.records == [{"step": 1, "loss": 0.5, "note": "ok"}]
    acc.end_training()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"config": {"lr": 0.1, "layers": 3}}, {"step": 1, "loss": 0.5, "note": "ok"}]
    with pytest.raises(ValueError, match="'comet' is not a known tracker"):
        Accelerator(log_with="comet").init_trackers("x")


def test_tensorboard_tracker_is_optional(tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install tensorboard"):
            Accelerator(log_with="tensorboard", project_dir=tmp_path).init_trackers("run")
        return
    acc = Accelerator(log_with="tensorboard", project_dir=tmp_path)
    acc.init_trackers("run", config={"lr": 0.1})
    acc.log({"loss": 0.5}, step=1)
    acc.end_training()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next((tmp_path / "run").glob("events.out.tfevents*"))))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.5)]


def test_automatic_checkpoint_naming_with_total_limit(tmp_path):
    from notebook_accel.checkpoint.project import ProjectConfiguration

    config = ProjectConfiguration(project_dir=tmp_path, automatic_checkpoint_naming=True, total_limit=2)
    acc = Accelerator(project_config=config)
    m = acc.prepare(torch.nn.Linear(2, 1))
    for value in range(3):
        torch.nn.init.constant_(m.weight, value)
        acc.save_state()
    assert [p.name for p in config.checkpoints()] == ["checkpoint_1", "checkpoint_2"]
    torch.nn.init.constant_(m.weight, -1)
    fresh = Accelerator(project_config=ProjectConfiguration(project_dir=tmp_path, automatic_checkpoint_naming=True))
    m2 = fresh.prepare(torch.nn.Linear(2, 1))
    assert fresh.load_state().name == "checkpoint_2"
    assert torch.all(m2.weight == 2) and fresh.project_configuration.iteration == 3
    assert fresh.get_state_dict(m2)["weight"].tolist() == [[2.0, 2.0]]
    with pytest.raises(FileNotFoundError, match="no automatic checkpoint"):
        Accelerator(project_config=ProjectConfiguration(tmp_path / "empty", automatic_checkpoint_naming=True)).load_state()


def test_files_a_save_hook_writes_are_there_for_the_load_hook(tmp_path):
    """The peer's test_save_load_model_with_hooks: the hook's data.json survives the atomic
    replace (as in the peer, which writes in place), also over an older checkpoint."""
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 2))

    def save_config(models, weights, output_dir):
        with open(os.path.join(output_dir, "data.json"), "w") as f:
            json.dump({"class_name": type(models[0]).__name__}, f)

    def load_config(models, input_dir):
        with open(os.path.join(input_dir, "data.json")) as f:
            models[0].class_name = json.load(f)["class_name"]

    acc.register_save_state_pre_hook(save_config)
    acc.register_load_state_pre_hook(load_config)
    target = tmp_path / "ckpt"
    acc.save_state(target)  # a first checkpoint, then one over it, with a stale file of ours
    torch.save({}, target / "pytorch_model_3.bin")
    (target / "notes.txt").write_text("mine")
    acc.save_state(target)
    model.class_name = "random"
    acc.load_state(target)
    assert model.class_name == "Linear"
    assert (target / "notes.txt").read_text() == "mine" and not (target / "pytorch_model_3.bin").exists()


def test_a_model_with_tied_weights_loads_from_a_safetensors_checkpoint(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(5, 3)
            self.out = torch.nn.Linear(3, 5, bias=False)
            self.out.weight = self.emb.weight

    acc = Accelerator()
    model = acc.prepare(Tied())
    saved = model.emb.weight.detach().clone()
    acc.save_state(tmp_path / "ckpt", safe_serialization=True)
    with torch.no_grad():
        model.emb.weight.zero_()
    acc.load_state(tmp_path / "ckpt")
    assert torch.equal(model.out.weight, saved) and model.out.weight is model.emb.weight


@pytest.mark.parametrize("offload", ["dispatch", "disk_offload"])
def test_save_model_of_a_model_with_offloaded_weights(tmp_path, offload):
    from notebook_accel import disk_offload, dispatch_model, load_checkpoint_in_model

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    reference, x = make(), torch.ones(1, 3)
    if offload == "dispatch":
        model = dispatch_model(make(), device_map={"0": "cpu", "1": "cpu", "2": "disk"},
                               offload_dir=tmp_path / "offload")
    else:
        model = disk_offload(make(), tmp_path / "offload", execution_device=torch.device("cpu"))
    Accelerator().save_model(model, tmp_path / "saved")
    restored = make()
    for parameter in restored.parameters():
        parameter.data.zero_()
    load_checkpoint_in_model(restored, tmp_path / "saved")
    assert all(torch.equal(a, b) for a, b in zip(restored.state_dict().values(),
                                                 reference.state_dict().values(), strict=True))
    assert torch.equal(model(x), reference(x))  # still dispatched, still runs


def test_strict_false_loads_a_checkpoint_with_missing_weights_and_is_refused_for_sharded_models(tmp_path):
    acc, model, opt, _, sched = setup()
    handle = acc.register_save_state_pre_hook(lambda models, weights, _: weights.__setitem__(0, {
        k: v for k, v in weights[0].items() if k.startswith("2.")}))  # keep only the last layer
    acc.save_state(tmp_path / "part")
    handle.remove()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*0\.weight"):
        acc.load_state(tmp_path / "part")
    acc.load_state(tmp_path / "part", strict=False)
    assert torch.equal(model[2].weight, saved["2.weight"]) and not model[0].weight.any()

    from notebook_accel.strategies.fsdp.plugin import FullyShardedDataParallelPlugin

    fsdp = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    fsdp.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"strict=False\) loads unsharded models only; FsdpCheckpointer"):
        fsdp.load_state(tmp_path / "part", strict=False)


def test_log_with_all_builds_every_installed_tracker(tmp_path, monkeypatch):
    from notebook_accel.observe import tracking

    with monkeypatch.context() as patch:  # only mlflow (and jsonl, always) installed
        for name in ("tensorboard", "wandb", "mlflow"):
            patch.setitem(tracking._INSTALLED, name, lambda name=name: name == "mlflow")
        assert tracking.available_trackers() == ["jsonl", "mlflow"]
    monkeypatch.setattr(tracking, "available_trackers", lambda: ["jsonl"])
    acc = Accelerator(log_with="all", project_dir=tmp_path)
    acc.init_trackers("run", config={"lr": 0.1})
    acc.log({"loss": 0.5}, step=1)
    assert [t.name for t in acc.trackers] == ["jsonl"]
    acc.end_training()
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2


def test_a_checkpoint_in_our_earlier_layout_still_loads(tmp_path):
    acc, model, opt, loader, sched = setup()
    train(acc, model, opt, sched, loader)
    acc.save_state(tmp_path / "ck", safe_serialization=False)
    saved, at_save = weights(model), torch.get_rng_state()
    ck = tmp_path / "ck"  # the names and the random-states format before the peer's layout
    for new, old in (("pytorch_model.bin", "model.pt"), ("optimizer.bin", "optimizer.pt"),
                     ("scheduler.bin", "scheduler.pt")):
        os.rename(ck / new, ck / old)
    rng = torch.load(ck / "random_states_0.pkl", weights_only=True)
    version, internal, gauss = rng["random_state"]
    kind, keys, pos, has_gauss, cached = rng["numpy_random_seed"]
    torch.save({"python": [version, list(internal), gauss], "torch": rng["torch_manual_seed"],
                "numpy": [kind, torch.tensor(keys, dtype=torch.int64), pos, has_gauss, cached]},
               ck / "random_states_0.pt")
    (ck / "random_states_0.pkl").unlink()
    train(acc, model, opt, sched, loader)
    acc.load_state(ck)
    assert torch.equal(weights(model), saved) and torch.equal(torch.get_rng_state(), at_save)


class _Dataset:  # the user's dataset, pickled inside the peer's sampler
    def __init__(self) -> None:
        self.rows = list(range(6))


class SeedableRandomSampler:  # the peer's class, as its sampler.bin names it (its module needs not exist)
    __module__ = "accelerate.data_loader"

    def __init__(self) -> None:
        self.data_source, self.generator = _Dataset(), torch.Generator().manual_seed(3)
        self.initial_seed, self.epoch, self.replacement = 42, 7, False


class _Planted:
    def __reduce__(self):
        return (os.mkdir, ("PLANTED",))


def test_the_peers_sampler_file_is_read_without_running_what_it_names(tmp_path, monkeypatch):
    """sampler.bin: the seed and epoch come out; no class it names is imported or called."""
    import sys
    import types

    from notebook_accel.checkpoint import peer_sampler

    package, fake = types.ModuleType("accelerate"), types.ModuleType("accelerate.data_loader")
    package.data_loader, fake.SeedableRandomSampler = fake, SeedableRandomSampler
    with monkeypatch.context() as patch:  # only while the file is written, as the peer's class would be
        patch.setitem(sys.modules, "accelerate", package)
        patch.setitem(sys.modules, "accelerate.data_loader", fake)
        _Dataset.__module__ = "users_notebook"
        patch.setitem(sys.modules, "users_notebook", types.SimpleNamespace(_Dataset=_Dataset))
        torch.save(SeedableRandomSampler(), tmp_path / "sampler.bin")
        _Dataset.__module__ = __name__
    monkeypatch.setitem(sys.modules, "accelerate.data_loader", None)  # importing it would fail
    position = peer_sampler.read(tmp_path / "sampler.bin")
    assert (position.initial_seed, position.epoch) == (42, 7)

    torch.save(_Planted(), tmp_path / "sampler_1.bin")
    monkeypatch.chdir(tmp_path)
    assert peer_sampler.read(tmp_path / "sampler_1.bin") is None
    assert not (tmp_path / "PLANTED").exists()  # os.mkdir was named, never called
