"""What every worker stands on: where it is, its process group, and how it trains one step.

``state`` (rank, world size, device, the process group; ``collective_backend`` and
``ensure_process_group``, each the one place), ``accelerator_state``, ``gradient_state``,
``precision``, ``optim`` (optimizer and scheduler wrappers), ``ops`` and ``op_checks``
(collectives), ``rng_sync`` and ``seeding``, ``plugins`` (option objects), ``helpers``,
``exit_teardown``, ``testing``, ``kwargs_handlers``; the device seam: ``device`` (one object per
device kind, ``TorchDevice``) and ``xla`` (``XlaDevice``, torch_xla imported lazily). Below ``data/``, ``checkpoint/``, ``observe/`` and ``strategies/``, which build on it;
it never imports them, nor ``launch/``.
"""
