"""A failed launch is also torch elastic's ``ChildFailedError`` (the peer's): code written for the
peer (``except ChildFailedError:``, reading ``.failures``) keeps working, and everything of ours
(attributes, text, rendering, pickling) stays as it was."""

from __future__ import annotations

import pickle
import subprocess
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.wire import FailureRecord

TRACEBACK = 'Traceback (most recent call last):\n  File "<cell 3>", line 2\nValueError: bad shape\n'


def _error() -> WorkerError:
    root = FailureRecord(rank=1, pid=4321, exitcode=1, exc_type="ValueError", headline="ValueError: bad shape",
                         traceback=TRACEBACK, timestamp=1000.0)
    killed = FailureRecord(rank=2, pid=4322, exitcode=-9, exc_type=None, headline="was killed by SIGKILL",
                           timestamp=999.0)
    stopped = FailureRecord(rank=0, pid=4320, exitcode=None, exc_type=None, headline="stopped", timestamp=1001.0)
    return WorkerError("rank 1 failed: ValueError: bad shape", rank=1, exitcode=1, remote_traceback=TRACEBACK,
                       other_failures=[killed, stopped], failure=root)


def test_a_worker_error_is_a_child_failed_error_with_each_failed_rank():
    error = _error()
    assert isinstance(error, WorkerError) and isinstance(error, RuntimeError)
    assert isinstance(error, ChildFailedError)
    assert sorted(error.failures) == [0, 1, 2]  # global rank -> its record
    root = error.failures[1]
    assert isinstance(root, ProcessFailure)
    assert (root.pid, root.exitcode, root.timestamp) == (4321, 1, 1000)
    assert "ValueError: bad shape" in root.message  # no error file: the rank's own traceback
    assert error.failures[2].exitcode == -9 and error.failures[2].message == "was killed by SIGKILL"
    assert error.failures[0].exitcode is None  # stopped while still running, as observed
    assert error.get_first_failure() == (1, root)  # the root cause is ours, not the earliest stamp
    assert "ValueError: bad shape" in error.format_msg()  # torch elastic's own summary works


def test_our_text_rendering_and_pickling_are_unchanged():
    error = _error()
    error.recovery = "the pool was healed"
    text = str(error)
    assert text.startswith("rank 1 failed: ValueError: bad shape\nthe pool was healed\n\nTraceback")
    assert "Other ranks:" in text and "rank 2: was killed by SIGKILL" in text
    assert type(error).__name__ == "WorkerError" and "WorkerError" in repr(error)
    rendered = "\n".join(error._render_traceback_())
    assert "WorkerError" in rendered and "[rank 1]" in rendered and "ChildFailedError" not in rendered
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, ChildFailedError) and isinstance(copy, WorkerError)
    assert (copy.rank, copy.exitcode, copy.recovery, str(copy)) == (1, 1, "the pool was healed", text)
    assert sorted(copy.failures) == [0, 1, 2]


def test_a_plain_worker_error_still_has_its_rank_in_failures():
    error = WorkerError("rank 0 was killed by SIGKILL", rank=0, exitcode=-9)
    assert isinstance(error, ChildFailedError)
    assert list(error.failures) == [0] and error.failures[0].exitcode == -9


def test_importing_worker_error_does_not_import_torch():
    code = ("import sys; from notebook_accel import WorkerError; import notebook_accel.launch.supervision.errors; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
