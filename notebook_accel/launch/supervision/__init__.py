"""Watching a launch: the supervisor's loop, hang watch, stacks, tracebacks and the verdicts that become a WorkerError."""
