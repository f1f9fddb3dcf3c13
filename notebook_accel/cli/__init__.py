"""The ``notebook-accel`` command (also ``python -m notebook_accel``; ``%accelerate env`` /
``test`` run the same code).

``command``: the parser, ``env`` and ``config``; ``launch``: ``launch`` and ``test``;
``sanity``: the short training run ``test`` makes.
"""

from notebook_accel.cli.command import main

__all__ = ["main"]
