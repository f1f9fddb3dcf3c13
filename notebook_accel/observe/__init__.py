"""Seeing a job from the notebook: ``progress`` (tqdm bars drawn once, in the kernel),
``tracking`` (experiment trackers, metrics streamed to the kernel) and ``logging``
(loggers that speak only on the main process).
"""
