"""Every rank's last collectives, always on: torch's own flight recorder, read as ours.

torch keeps a ring of each process's last collectives (``TORCH_FR_BUFFER_SIZE`` entries,
gloo's as NCCL's) in C++, written when a collective is issued: its group, its sequence
number (the backend's count, the very number the stop button's cut counts, so DDP's own
gradient reductions are numbered too), its tensors' dtypes and shapes, the Python stack
that issued it (captured cheaply, turned into names only when read) and whether it ended.
Recording costs no Python at all; reading is what this module does, on demand: the hang
watch's ``StackAsk`` (a pool's reader thread), a one-off worker's ``SIGUSR1``, and
``pool.collectives()``. The first read of a process with ``where`` names the frames' code
(about a second, once); later reads, and reads without ``where``, take milliseconds.

The ring is the process's, not the group's: :data:`RING` entries, of which
:func:`recent` keeps the last ``last`` per group (256 by default). A busy group (DDP's
gradients) pushes a quiet group's entries out after :data:`RING` collectives; torch still
counts every group's collectives (the dump's ``pg_status``), so such a group is read as
one entry, its latest number, marked :data:`OUT_OF_RING` (its op, tensors and line are
gone): a rank that never reached the quiet group's next collective is still said to be
short of it, by how many.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from notebook_accel.launch.worker.stop_cut import users_file
from notebook_accel.wire import Collective

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"  # torch's setting: entries in the ring (0: off)
RING = 2048  # the ring's entries when the user did not set BUFFER_ENV
PER_GROUP = 256  # what a read keeps per group by default
SETTLE_S = 0.5  # how long an idle rank's read waits for torch to mark its ended collectives
SIGNALLED = 4  # per group, what a one-off worker writes on SIGUSR1 (the latest is compared)
OUT_OF_RING = "(out of the ring)"  # the op of a group whose entries the ring no longer holds
DUMP_MARK = "notebook_accel flight recorder: "  # a one-off worker's stderr line (then JSON)
_CHECK_MODULE = os.path.join("runtime", "collective_check.py")  # its descriptors' all_gathers
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


def switch_on(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that switch the recorder on in a worker (none if the user set the size,
    0 included: their choice stands)."""
    environ = os.environ if environ is None else environ
    return {} if environ.get(BUFFER_ENV) else {BUFFER_ENV: str(RING)}


def recent(last: int = PER_GROUP, where: bool = True, settle: bool = False) -> tuple[Collective, ...]:
    """This process's last ``last`` collectives per group, oldest first (empty: no recorder,
    or nothing recorded yet); ``where`` False: without the user's frame (a fast read).

    ``settle``: the main thread is in no collective (an idle pool's rank), so an entry not yet
    marked ended is read again, for up to :data:`SETTLE_S`. torch marks a collective ended
    on the backend's own thread, after the rank's wait has returned: a read right after it
    often finds the entry still ``scheduled``."""
    dump = _dump(where)
    deadline = time.monotonic() + SETTLE_S
    while settle and dump and not _all_ended(dump) and time.monotonic() < deadline:
        time.sleep(0.001)
        dump = _dump(where)
    return from_dump(dump, last) if dump else ()


def _all_ended(dump: Mapping[str, Any]) -> bool:
    return all(map(_ended, dump["entries"]))


def _ended(entry: Mapping[str, Any]) -> bool:
    return bool(entry.get("retired")) or entry.get("state") == "completed"


def _dump(where: bool) -> dict[str, Any] | None:
    """torch's dumps: the recorder of every backend, and NCCL's own where torch has one
    (a CUDA build), their entries together (an entry in both, once)."""
    from torch._C import _distributed_c10d as c10d

    entries: dict[tuple, Any] = {}
    counts: dict[str, Any] = {}
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            found = pickle.loads(dump(includeStackTraces=where))
        except Exception:  # noqa: BLE001 - no process group ever made, or the recorder off
            continue
        for entry in found.get("entries", []):
            key = (str(entry.get("process_group")), entry.get("collective_seq_id"),
                   entry.get("p2p_seq_id"), entry.get("time_created_ns"))
            entries.setdefault(key, entry)
        counts.update(found.get("pg_status", {}))
    if not entries:
        return None
    return {"entries": list(entries.values()), "pg_status": counts,
            "group_descriptions": _group_descriptions()}


def _group_descriptions() -> dict[str, str]:
    """Each live process group's name (``"1"``) -> its description (``"quiet"``)."""
    try:
        import torch.distributed.distributed_c10d as c10d

        return {c10d._get_process_group_name(group): group.group_desc  # noqa: SLF001
                for group in c10d._world.pg_names}  # noqa: SLF001
    except Exception:  # noqa: BLE001 - torch's private names moved: groups named by number
        return {}


def from_dump(dump: Mapping[str, Any], last: int = PER_GROUP) -> tuple[Collective, ...]:
    """torch's dump (``_dump_fr_trace``) as :class:`Collective` s, the last ``last`` per group,
    oldest first; point-to-point operations and ``check_collectives``' own exchanges left out
    (but the one a rank waits in, named as the check's)."""
    kept: dict[str, list[Collective]] = {}
    for entry in dump.get("entries", ()):
        check = _from_the_check(entry.get("frames", ()))
        collective = _collective(entry)
        if entry.get("is_p2p") or (check and collective.done):
            continue
        if check:
            collective = collective._replace(op=f"{collective.op} (check_collectives)")
        kept.setdefault(collective.group, []).append(collective)
    descriptions = dump.get("group_descriptions", {})
    for name, status in dump.get("pg_status", {}).items():
        number = int(status.get("last_enqueued_collective", -1))
        group = group_name((name, descriptions.get(name, "")))
        if number > 0 and group not in kept:  # its entries pushed out by a busier group's
            done = int(status.get("last_completed_collective", -1)) >= number
            kept[group] = [Collective(number, group, OUT_OF_RING, (), None, 0.0, None, done)]
    chosen = [c for group in kept.values() for c in group[-last:]] if last > 0 else []
    return tuple(sorted(chosen, key=lambda c: c.started))


def _collective(entry: Mapping[str, Any]) -> Collective:
    name = str(entry.get("profiling_name", "?"))
    completed = entry.get("time_discovered_completed_ns")
    return Collective(
        number=int(entry.get("collective_seq_id", 0)),
        group=group_name(entry.get("process_group", ("?", ""))),
        op=name.split(":", 1)[-1],  # "gloo:all_reduce", "nccl:all_reduce"
        tensors=tuple(tensor_text(d, s) for d, s in
                      zip(entry.get("input_dtypes", ()), entry.get("input_sizes", ()), strict=False)),
        where=users_frame(entry.get("frames", ())),
        started=entry.get("time_created_ns", 0) / 1e9,
        ended=None if completed is None else completed / 1e9,
        done=_ended(entry),
    )


def group_name(process_group: Sequence[str]) -> str:
    """``default`` for the default group, else its description (or its number: ``1``)."""
    number, description = (tuple(process_group) + ("", ""))[:2]
    if description == "default_pg":
        return "default"
    return description if description and description != "undefined" else str(number)


def tensor_text(dtype: str, shape: Sequence[int]) -> str:
    """``float32[1024]``, ``int64[2,3]``, ``float32[]`` (a scalar)."""
    return f"{_DTYPES.get(dtype, dtype.lower())}[{','.join(str(n) for n in shape)}]"


def users_frame(frames: Sequence[Mapping[str, Any]]) -> tuple[str, int, str] | None:
    """The innermost frame of the user's code among ``frames`` (innermost first)."""
    for frame in frames:
        filename = frame.get("filename", "")
        if users_file(filename):
            return (filename, int(frame.get("line", 0)), str(frame.get("name", "?")))
    return None


def _from_the_check(frames: Sequence[Mapping[str, Any]]) -> bool:
    return any(frame.get("filename", "").endswith(_CHECK_MODULE) for frame in frames[:6])


# -- a one-off worker: read on SIGUSR1, beside faulthandler's stacks ---------------------------

def answer_on_signal() -> None:
    """Write this worker's recorder to its stderr, one line (:data:`DUMP_MARK` + JSON), on
    each ``SIGUSR1`` (the kernel's ``dump_stacks``), even while the main thread waits in a
    collective: Python's C handler writes the signal to a wakeup pipe that a thread reads.
    Call from the main thread, before faulthandler registers ``SIGUSR1`` with ``chain``."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(read_end)
        os.close(write_end)
        return
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    threading.Thread(target=_answer, args=(read_end,), name="notebook_accel recorder",
                     daemon=True).start()


def _answer(read_end: int) -> None:
    while True:
        try:
            woken = os.read(read_end, 64)
        except OSError:
            return
        if not woken:
            return
        if signal.SIGUSR1 in woken:
            with contextlib.suppress(Exception):
                line = DUMP_MARK + json.dumps([list(c) for c in recent(SIGNALLED, where=False)]) + "\n"
                sys.__stderr__.write(line)  # (the rank's stack, faulthandler's, says where)
                sys.__stderr__.flush()


def read_dump_line(text: str) -> tuple[Collective, ...] | None:
    """The collectives of a line :func:`answer_on_signal` wrote (None: not such a line)."""
    if not text.startswith(DUMP_MARK):
        return None
    try:
        rows = json.loads(text[len(DUMP_MARK):])
        return tuple(Collective(number, group, op, tuple(tensors),
                                tuple(where) if where else None, started, ended, done)
                     for number, group, op, tensors, where, started, ended, done in rows)
    except (ValueError, TypeError):
        return None
