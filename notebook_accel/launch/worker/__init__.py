"""The worker side of a launch: what runs only inside a worker process.

``main``: the entry point every worker runs first (set up the process, run the
user's function, report back over the wire). ``display``: a worker's rich output
and progress bars, routed to the kernel. ``xla_cores``: the XLA host worker, which
starts the TPU cores through torch_xla's own launcher. ``main_module``: keeping a
caller's ``__main__`` from running again in started children.

Nothing here imports the kernel side (``launch.backends``, ``launch.supervisor``,
``launch.launcher``...); the import-linter contract ``worker-no-kernel`` says so.
"""
