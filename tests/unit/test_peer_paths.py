"""The peer's module paths under our name (``notebook_accel/_peer_paths.py``): each is the very
module that owns the concept, submodules included, and pickles still name the real path; the
peer module's names that other modules own are there too (``PEER_NAMES``)."""

import importlib
import inspect
import pickle

import pytest

from notebook_accel._peer_paths import PEER_NAMES, PEER_PATHS, peer_names, real_name


@pytest.mark.parametrize("alias", sorted(PEER_PATHS))
def test_a_peer_path_is_the_module_that_owns_it(alias):
    assert importlib.import_module(alias) is importlib.import_module(PEER_PATHS[alias])


def test_submodules_of_a_peer_package_are_the_real_ones_and_patching_either_name_patches_both(monkeypatch):
    import notebook_accel.strategies.fsdp.state_dict as real

    by_alias = importlib.import_module("notebook_accel.fsdp.state_dict")

    assert by_alias is real and real_name("notebook_accel.fsdp.state_dict") == real.__name__
    monkeypatch.setattr("notebook_accel.state.PartialState", "patched")
    from notebook_accel.runtime import state

    assert state.PartialState == "patched"


def test_classes_keep_their_real_module_for_pickling():
    from notebook_accel.data_loader import SkipDataLoader
    from notebook_accel.state import DistributedType

    assert SkipDataLoader.__module__ == "notebook_accel.data.skip"
    assert importlib.import_module("notebook_accel.state").__spec__.name == "notebook_accel.runtime.state"
    assert pickle.loads(pickle.dumps(DistributedType.NO)) is DistributedType.NO


def test_unknown_paths_stay_unknown():
    assert real_name("notebook_accel.stateful") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("notebook_accel.data_loaders")


@pytest.mark.parametrize("path", sorted(PEER_NAMES))
def test_the_names_a_peer_path_adds_are_their_owners_objects(path):
    module = importlib.import_module(path)
    for name, owner in peer_names(real_name(path) or path).items():
        assert getattr(module, name) is getattr(importlib.import_module(owner), name), (path, name)
        assert name in dir(module)
    with pytest.raises(AttributeError, match="no attribute 'not_a_peer_name'"):
        module.not_a_peer_name  # noqa: B018


def _public(module):
    return {n for n in dir(module) if not n.startswith("_") and not inspect.ismodule(getattr(module, n))}


@pytest.mark.parametrize("path", [*sorted(PEER_PATHS), "notebook_accel.accelerator"])
def test_every_name_of_the_peers_module_that_we_export_is_at_its_path_too(path):
    """Against the installed peer: a name of ``accelerate.X`` that we export (at the top or in
    ``notebook_accel.utils``) is also ``notebook_accel.X``'s."""
    peer = pytest.importorskip("accelerate" + path[len("notebook_accel"):])
    import notebook_accel
    import notebook_accel.utils

    ours = set(notebook_accel.__all__) | _public(notebook_accel.utils)
    module = importlib.import_module(path)
    lacking = sorted(n for n in _public(peer) & ours if not hasattr(module, n))
    assert lacking == []
