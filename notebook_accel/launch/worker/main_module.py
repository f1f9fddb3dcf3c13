"""Keep multiprocessing from re-running the caller's ``__main__`` in the processes it starts."""

from __future__ import annotations

import contextlib
import sys
import types


@contextlib.contextmanager
def main_module_hidden(hide: bool):
    """Keep multiprocessing from re-running the caller's ``__main__`` in spawned processes.

    The payload carries everything the function needs (by value), so a script
    without an ``if __name__ == "__main__":`` guard must not be executed again
    in every worker, as plain multiprocessing would. Used by the kernel when it
    starts workers and by the XLA host worker when it starts the cores.
    """
    if not hide:
        yield
        return
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main
