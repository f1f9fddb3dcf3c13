"""The kernel side's tuning constants: timeouts, intervals and budgets, each named once here.

Grouped by the stage that reads them. A constant says what it tunes and in what unit; the
options a user sets (``timeout``, ``hang_after``, ``stop_wait``) are rows of
``notebook_accel/contract.py``, not constants.
"""

from __future__ import annotations

# -- supervision: the watch loop (supervision/supervisor.py, ready_channels.py) ---------------------

WAKEUP_BUDGET = 0.0004  # seconds a wakeup spends on what is ready (one channel at least): a burst
# of every rank's lines is taken over several wakeups, back to back, the oldest first
MOST_READY = 64  # channels one select takes from the kernel (more wait their turn, in order):
# what a wakeup pays for them is bounded too, even when thousands are ready at once
LONGEST_WAIT = 0.1  # seconds the loop waits for a channel at most, before it looks at the
# timeout, the hang watch and the stop button again
OUTPUT_READ = 1 << 16  # bytes one read of a rank's output takes (backends' read_output): a
# shorter read drained the pipe, so the loop does not read it twice
RSS_BUDGET = 0.0001  # seconds a wakeup spends sampling memory (one rank at least): a few system
# calls (a local rank's), or dozens of figures at hand
RSS_EVERY = 1.0  # seconds between two samples of one rank's memory (a warm pool's runs are often
# far shorter: their first samples wait this long)
COLLECT_AFTER_FAILURE = 0.3  # seconds to gather other ranks' reports after the first failure,
# before stopping them (less when every rank still running has reported already)
SUBSET_LOOK_EVERY = 0.5  # seconds between two looks at the stacks of a run on some ranks of a
# pool (a rank entering a collective of the whole group is stopped)
EXIT_REAP_WAIT = 1.0  # seconds the kernel waits to reap a rank whose exit it saw

# -- supervision: stopping a launch (a timeout, a failure, the stop button) ------------------------

STOP_POLL = 0.05  # seconds one wakeup waits while a stop or a timeout waits for the ranks
INTERRUPT_GRACE = 1.5  # seconds a persistent worker has to end its run after an interrupt,
# before it is killed (blocked in C++ code, e.g. a collective)
KILL_REAP_WAIT = 5.0  # seconds the kernel waits to reap a rank it killed
TIMEOUT_DUMP_WAIT = 0.5  # seconds a timeout waits for the running ranks' stack dumps (written
# at once, by a signal handler) before stopping them

# -- supervision: the hang watch and the ranks' stacks (verdicts/hangs.py, stack_dumps.py) -------------

HANG_LOOK_EVERY = 0.5  # seconds between two looks for ranks silent for hang_after
HANG_RECORDED = 4  # collectives per group a silent rank sends (the latest is what is compared)
DUMP_WAIT = 0.5  # seconds a one-off launch's stack dumps have to arrive (a signal handler's)
DUMP_LATEST = 3.0  # seconds the dumps' flight-recorder lines have, at most
STACKS_WAIT = 1.0  # seconds pool.stacks() waits for the idle ranks' answers (default)
RECORDERS_WAIT = 5.0  # seconds pool.collectives() waits (a process's first read names the
# frames' code: about a second)
DEATH_TAIL = 1000  # lines of a dead rank's stderr read for why it died (its traceback)

# -- pools ----------------------------------------------------------------------------------------

CANCEL_WAIT = 60.0  # seconds a pool's close() waits for a background run to stop before ending it
