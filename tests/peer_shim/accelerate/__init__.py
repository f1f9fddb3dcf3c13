"""An ``accelerate`` package that only re-exports notebook_accel (for running the peer's own test scripts).

Put this directory's parent first on ``sys.path``; every ``accelerate.X`` the peer's
scripts import is a view of our modules under the peer's name. Nothing here is code
of its own, and our modules are not changed: a user switching would change their
imports to exactly these names.
"""

import sys
import types

import notebook_accel
from notebook_accel import accelerator as _accelerator
from notebook_accel import data_loader
from notebook_accel import local_sgd as _local_sgd
from notebook_accel import logging as _logging
from notebook_accel import state as _state
from notebook_accel import test_utils as testing
from notebook_accel import utils as _utils
from notebook_accel.runtime import accelerator_state, gradient_state, plugins

for _name in notebook_accel.__all__:
    if _name != "config_panel":  # the notebook front end (ipywidgets), not an accelerate name
        globals()[_name] = getattr(notebook_accel, _name)


def _view(name, *sources):
    module = types.ModuleType(f"{__name__}.{name}", f"notebook_accel's {name} names")
    for source in sources:
        module.__dict__.update({k: v for k, v in vars(source).items() if not k.startswith("__")})
    sys.modules[module.__name__] = module
    return module


accelerator = _view("accelerator", _accelerator, plugins)
state = _view("state", _state, accelerator_state, gradient_state)
data_loader = _view("data_loader", data_loader)
utils = _view("utils", _utils)
utils.dataclasses = _view("utils.dataclasses", _utils)
utils.operations = _view("utils.operations", _utils)
utils.memory = _view("utils.memory", _utils)
local_sgd = _view("local_sgd", _local_sgd)
test_utils = _view("test_utils", testing)
test_utils.testing = _view("test_utils.testing", testing)
logging = _view("logging", _logging)  # deepspeed_with_config_support: from accelerate.logging import get_logger
