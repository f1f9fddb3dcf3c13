"""The peer's module paths under our name (``notebook_accel/_peer_paths.py``): each is the very
module that owns the concept, submodules included, and pickles still name the real path."""

import importlib
import pickle

import pytest

from notebook_accel._peer_paths import PEER_PATHS, real_name


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
