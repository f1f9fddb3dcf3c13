"""Seeing a job from the notebook: ``progress`` (tqdm bars drawn once, in the kernel),
``tracking`` (experiment trackers, metrics streamed to the kernel), ``run_trackers`` (an
Accelerator's trackers for one run) and ``logging``
(loggers that speak only on the main process).
"""
