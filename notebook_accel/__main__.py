"""``python -m notebook_accel``: the ``notebook-accel`` command."""

from notebook_accel.cli import main

raise SystemExit(main())
