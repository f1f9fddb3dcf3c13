"""The ``Accelerator``'s parts, one job each (``notebook_accel.accelerator`` composes them).

``forwarding`` (its properties read from the process state, the strategy, the gradient state
and the loader settings), ``preparing`` (``prepare`` and its ``prepare_*``), ``training_step`` (backward, accumulation,
autocast, clipping), ``process_control`` (collectives, barriers, which process runs what),
``saving`` (weights and ``save_state`` / ``load_state``) and ``snapshotting`` (background
snapshots and ``resume``). The mechanics stay where they live (``strategies/``, ``checkpoint/``,
``runtime/``); these modules are the peer's surface over them.
"""
