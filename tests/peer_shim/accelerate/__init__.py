"""An ``accelerate`` package that only re-exports notebook_accel (for running the peer's own tests).

Put this directory's parent first on ``sys.path``; every ``accelerate.X`` the peer's
scripts and tests import is a view of our modules under the peer's name: the views
below, else ``notebook_accel.X`` itself (the peer paths of ``notebook_accel/_peer_paths.py``:
``accelerate.big_modeling``, ``accelerate.logging``, ``accelerate.tracking``...). Nothing
here is code of its own, and our modules are not changed: a user switching would change
their imports to exactly these names.

Two things only for the peer's ``tests/`` files (``run_peer_tests.py``):

- ``PEER_SHIM_HARNESS=DIR``: ``accelerate.test_utils`` is the peer's test *harness*
  (``DIR/test_utils``: its ``testing.py`` and ``training.py``, copied from the sdist at
  test time: skip decorators, TestCase bases, fixture models); it tests nothing itself,
  and what it imports from ``accelerate`` is ours.
- A name of the peer's that ``accelerate.utils``, a view or an aliased module (in this
  test process only) lacks is a ``Missing`` stand-in: importing it works, so the rest of a test file runs; using it raises
  ``NotImplementedError`` naming it, and the runner lists those tests as departures.
  A missing ``is_X_available`` answers ``False`` (we have no such integration).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

import notebook_accel
from notebook_accel import accelerator as _accelerator
from notebook_accel import data_loader as _data_loader
from notebook_accel import local_sgd as _local_sgd
from notebook_accel import state as _state
from notebook_accel import test_utils as _testing
from notebook_accel import utils as _utils
from notebook_accel.runtime import accelerator_state, gradient_state, plugins

__version__ = "1.15.0"  # the peer version whose names the shim serves

for _name in notebook_accel.__all__:
    if _name != "config_panel":  # the notebook front end (ipywidgets), not an accelerate name
        globals()[_name] = getattr(notebook_accel, _name)


class Missing:
    """A peer name notebook_accel does not have: importable, unusable (says which name)."""

    def __init__(self, qualname):
        self.qualname = qualname

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self.qualname} is not part of notebook_accel (peer API not exposed)")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(f"{self.qualname}.{name}")

    def __repr__(self):
        return f"<Missing {self.qualname}>"

    def __mro_entries__(self, bases):  # a class built on a missing one: fails when instantiated
        return (type(self.qualname.rsplit(".", 1)[-1], (_MissingBase,), {"qualname": self.qualname}),)


class _MissingBase:
    qualname = "?"

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{self.qualname} is not part of notebook_accel (peer API not exposed)")


def _not_available():
    return False


def _missing_names(module, peer_name=None):
    """Absent names of ``module`` answer with stand-ins (after its own ``__getattr__``, if any)."""
    own = module.__dict__.get("__getattr__")
    peer_name = peer_name or module.__name__

    def __getattr__(name):
        if own is not None:
            try:
                return own(name)
            except AttributeError:
                pass
        if name.startswith("__"):
            raise AttributeError(name)
        if name.startswith("is_") and name.endswith("_available"):
            return _not_available
        return Missing(f"{peer_name}.{name}")

    if not getattr(own, "_peer_shim", False):
        __getattr__._peer_shim = True
        module.__getattr__ = __getattr__
    return module


def _view(name, *sources):
    module = types.ModuleType(f"{__name__}.{name}", f"notebook_accel's {name} names")
    for source in sources:
        module.__dict__.update({k: v for k, v in vars(source).items() if not k.startswith("__")})

    def __getattr__(attr):  # a source's names resolved on first use (its own __getattr__)
        for source in sources:
            try:
                return getattr(source, attr)
            except AttributeError:
                pass
        raise AttributeError(attr)

    module.__getattr__ = __getattr__
    sys.modules[module.__name__] = _missing_names(module)
    return module


accelerator = _view("accelerator", _accelerator, plugins)
state = _view("state", _state, accelerator_state, gradient_state)
data_loader = _view("data_loader", _data_loader)
utils = _view("utils", _utils)
utils.__path__ = []  # a package: its submodules (utils.modeling, utils.memory...) are views too
local_sgd = _view("local_sgd", _local_sgd)
_HARNESS = os.environ.get("PEER_SHIM_HARNESS")
if _HARNESS:
    __path__.append(_HARNESS)  # accelerate.test_utils: the peer's harness (see above)
else:
    test_utils = _view("test_utils", _testing)
    test_utils.testing = _view("test_utils.testing", _testing)


def _ours(name):
    try:
        return importlib.util.find_spec("notebook_accel" + name[len(__name__):]) is not None
    except ModuleNotFoundError:
        return False


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``accelerate.utils.<any>`` -> the utils view; other ``accelerate.X`` -> ``notebook_accel.X``,
    or a module of ``Missing`` names where we have none (``accelerate.hooks``...)."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith(__name__ + ".") or name in sys.modules:
            return None
        if name.startswith(f"{__name__}.utils."):
            return importlib.machinery.ModuleSpec(name, self)
        if name == f"{__name__}.test_utils" or name.startswith(f"{__name__}.test_utils."):
            return None  # the harness, found on __path__ (or the view above)
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        if spec.name.startswith(f"{__name__}.utils."):
            return _view(spec.name[len(__name__) + 1:], _utils)
        if not _ours(spec.name):  # a peer module we have no counterpart of: every name Missing
            return _view(spec.name[len(__name__) + 1:])
        module = importlib.import_module("notebook_accel" + spec.name[len(__name__):])
        spec.loader_state = module.__spec__  # the import system sets __spec__ to ours next
        return _missing_names(module, spec.name)  # in this test process only

    def exec_module(self, module):
        if isinstance(module.__spec__.loader_state, importlib.machinery.ModuleSpec):
            module.__spec__ = module.__spec__.loader_state  # notebook_accel's own spec again


if not any(isinstance(finder, _Aliases) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Aliases())
