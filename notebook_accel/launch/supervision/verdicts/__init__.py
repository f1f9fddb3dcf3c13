"""What the supervisor concludes from what it knows of the ranks, each verdict a unit of its own.

root_cause.py (which rank's failure ended the job, and what the error says), timeout.py (a
timeout's error, the ranks grouped by where they were), lone_collective.py (a run on some
ranks of a pool entered a collective the other ranks never join), interrupted.py (what the
stop button did, in one line): functions of the supervisor's ``Worker`` records, no process
needed. hangs.py (``HangWatch``: a rank silent for ``hang_after`` seconds marked, every rank's
stack shown once) is told of progress by the supervisor's loop and looks on each wakeup.
"""
