"""What a keeper does with its pool for a kernel: runs, their output and outcome, the pool's state.

Each operation is one request on the keeper's socket (``framing.py``) answered by
:meth:`PoolService.answer`:

- ``plan``: the pool's :class:`~notebook_accel.launch.planning.plan.LaunchPlan`;
- ``call``: one of the pool's questions or actions (``ASKED``: ``names_on``, ``revive``...),
  with what it printed;
- ``submit``: a run of the body (a payload the kernel serialised for the pool, forwarded as
  it is) on ``ranks``, in the background (on the keeper's one thread of runs); its output goes
  to rings on disk (``output_ring.py``); with ``stream`` (a run the kernel shows now), the
  connection's own thread runs it and sends its output as it comes, then its outcome
  (:meth:`PoolService.stream`);
- ``run``: the latest run (running or ended): its number, what it is, its state;
- ``since``: that run's pieces of output from a number on (waiting up to ``timeout_s``); the
  last read of an ended run carries its outcome too (a short run is two requests);
- ``cancel``: its stop, the stop button's consistent cut;
- ``outcome``: its value or its error, once it has ended; ``logs``: a rank's whole output.

Answers holding Python objects are cloudpickled: ``("value", value, printed)`` or
``("raise", error, printed)``; an error that could not be rebuilt in the kernel travels as a
``RuntimeError`` with its text.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

import cloudpickle

from notebook_accel.launch.detached.output_ring import RingOutput
from notebook_accel.launch.pools.run_handle import RunHandle
from notebook_accel.launch.pools.thread_output import routed_to

ASKED = ("names_on", "copies_on", "lost", "heals", "status", "revive", "stacks",
         "collectives")  # what a kernel may ask the pool (``call``)
OPS = ("plan", "call", "submit", "run", "since", "cancel", "outcome", "logs")
_WAIT_MOST = 5.0  # seconds a ``since`` may wait for output
STREAM_BUFFER = 4 << 20  # bytes of a streamed run's messages waiting for a slow kernel, at most
_FINISH_WAIT = 5.0  # seconds a streamed run's last messages may take to leave


class PoolService:
    """A keeper's pool, for the kernels that attach: one thread per connection calls
    :meth:`answer`; one run at a time (the pool refuses another while one runs)."""

    def __init__(self, pool: Any, output_folder: Any) -> None:
        self.pool = pool
        self.output_folder = output_folder
        self.number = 0  # the latest run's
        self._lock = threading.Lock()  # calls on the pool, one at a time
        self._local = threading.local()  # a connection's thread's run to stream (submit's)
        self._runs: queue.Queue[Callable[[], None]] = queue.Queue()
        threading.Thread(target=self._pump, name="notebook_accel: runs", daemon=True).start()

    @property
    def handle(self) -> RunHandle | None:
        """The latest run's handle."""
        return self.pool.background

    def running(self) -> bool:
        handle = self.handle
        return handle is not None and not handle.done()

    def state(self) -> str:
        """``idle``, or ``running cell [14] (12:05, step 912)``."""
        handle = self.handle
        if handle is None or handle.done():
            return "idle"
        return f"running {handle.what} ({handle.state().removeprefix('running ')})"

    def describe(self, name: str, since: float, idle_timeout: float) -> dict[str, Any]:
        """What a keeper tells of its pool: name, pid (the keeper's), ranks, alive, device,
        state, since, memory (bytes: the keeper's and its ranks'), idle_timeout."""
        import psutil

        ranks = self.pool.status()
        memory = psutil.Process().memory_info().rss + sum(r.rss or 0 for r in ranks)
        return {"name": name, "pid": os.getpid(), "ranks": len(ranks),
                "alive": sum(r.alive for r in ranks), "device": self.pool.plan.device_type,
                "state": self.state(), "since": since, "memory": memory,
                "idle_timeout": idle_timeout}

    def answer(self, op: str, head: dict[str, Any], body: bytes) -> bytes:
        """The cloudpickled answer to ``op``."""
        printed = io.StringIO()
        try:
            with routed_to(printed, printed):
                value = getattr(self, f"_{op}")(head, body)
            return _dumps(("value", value, printed.getvalue()))
        except BaseException as error:  # noqa: BLE001 - it is the kernel's to raise
            return _dumps(("raise", _portable(error), printed.getvalue()))

    def _pump(self) -> None:
        """The runs' thread, started once: each run's output pump in turn (a thread started
        per run would cost a short run about a millisecond)."""
        while True:
            self._runs.get()()

    def _plan(self, head: dict[str, Any], body: bytes) -> Any:
        return self.pool.plan

    def _call(self, head: dict[str, Any], body: bytes) -> Any:
        name = head["name"]
        if name not in ASKED:
            raise ValueError(f"a detached pool answers {', '.join(ASKED)}; not {name!r}")
        args = tuple(head.get("args") or ())
        with self._lock:
            attribute = getattr(self.pool, name)
            return attribute(*args) if callable(attribute) else attribute

    def _submit(self, head: dict[str, Any], body: bytes) -> dict[str, Any]:
        ranks = head.get("ranks")
        with self._lock:
            self.pool._refuse_if_busy()  # (before the old run's rings are removed)
            previous = self.handle
            output = RingOutput(self.output_folder, f"run{self.number + 1}")
            handle = RunHandle(head["what"], head["advice"], output)
            pump = self.pool.submit_payload(body, None if ranks is None else tuple(ranks), handle)
            self.number += 1
            if head.get("stream"):  # the connection's thread pumps it (stream())
                self._local.streamed = (pump, output, self.number)
            else:
                self._runs.put(pump)
            if previous is not None and isinstance(previous.output, RingOutput):
                previous.output.remove()
            return self._run(head, body)

    def streamed(self) -> tuple[Callable[[], None], RingOutput, int] | None:
        """The run this thread's last ``submit`` asked to stream, if any (once)."""
        streamed, self._local.streamed = getattr(self._local, "streamed", None), None
        return streamed

    def stream(self, connection: socket.socket, streamed: tuple[Callable[[], None], RingOutput, int]) -> bool:
        """Pump a run on this thread (no thread between the kernel and the workers), sending
        its pieces to ``connection`` as the relay writes them, each message a ``since``
        answer, the last with the outcome. Sends never block the run: what the kernel does not
        take at once waits in a buffer (``STREAM_BUFFER`` at most, then the stream is given up:
        the kernel reads the rest from the rings). Returns whether the connection goes on."""
        pump, output, number = streamed
        sender = _Sender(connection)

        def listener(first: int, items: list[tuple[str, Any]]) -> None:
            sender.add(_dumps(("value", {"items": items, "next": first + len(items), "dropped": 0,
                                         "ended": False, "count": first + len(items),
                                         "dropped_lines": output.dropped_lines}, "")))

        output.listener = listener
        try:
            pump()
        finally:
            output.listener = None
        sender.add(self.answer("since", {"run": number, "number": output.count}, b""))
        return sender.finish()

    def _run(self, head: dict[str, Any], body: bytes) -> dict[str, Any] | None:
        handle = self.handle
        if handle is None:
            return None
        return {"number": self.number, "what": handle.what, "advice": handle.advice,
                "state": handle.state(), "done": handle.done(), "step": handle.step}

    def _latest(self, head: dict[str, Any]) -> RunHandle:
        handle = self.handle
        if handle is None or head.get("run") != self.number:
            raise LookupError(f"run {head.get('run')} is not kept: a detached pool keeps its "
                              f"latest run only (number {self.number})")
        return handle

    def _since(self, head: dict[str, Any], body: bytes) -> dict[str, Any]:
        output = self._latest(head).output
        items, following, dropped = output.since(int(head["number"]),
                                                 min(float(head.get("timeout_s") or 0), _WAIT_MOST))
        answer = {"items": items, "next": following, "dropped": dropped, "ended": output.ended,
                  "count": output.count, "dropped_lines": output.dropped_lines}
        if output.ended and following == answer["count"]:  # the last read: the outcome with it
            answer["outcome"] = self._outcome(head, body)
        return answer

    def _cancel(self, head: dict[str, Any], body: bytes) -> bool:
        handle = self._latest(head)
        return handle.cancel(timeout=0)

    def _outcome(self, head: dict[str, Any], body: bytes) -> tuple[Any, BaseException | None]:
        handle = self._latest(head)
        if not handle.done():
            raise RuntimeError(f"{handle.what} is still running")
        try:  # (its failure counts as told: the kernel that asked raises it)
            return handle.result(timeout=0), None
        except BaseException as error:  # noqa: BLE001 - the kernel's to raise
            return None, _portable(error)

    def _logs(self, head: dict[str, Any], body: bytes) -> str:
        return self._latest(head).logs(int(head["rank"]), head.get("stream"))


class _Sender:
    """Messages to a kernel on a socket, sent without blocking the run (see ``stream``)."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.waiting = bytearray()
        self.live = True

    def add(self, answer: bytes) -> None:
        if not self.live:
            return
        self.waiting += json.dumps({"ok": True, "size": len(answer)}).encode() + b"\n" + answer
        if len(self.waiting) > STREAM_BUFFER:
            self.live = False  # the kernel reads too slowly: it goes on from the rings
            return
        try:
            self.connection.setblocking(False)
            sent = self.connection.send(self.waiting)
            del self.waiting[:sent]
        except BlockingIOError:
            pass
        except OSError:
            self.live = False  # the kernel left
        finally:
            self.connection.setblocking(True)

    def finish(self) -> bool:
        """Send what waits (within ``_FINISH_WAIT`` seconds); whether the connection goes on."""
        if not self.live:
            return False
        try:
            self.connection.settimeout(_FINISH_WAIT)
            self.connection.sendall(self.waiting)
            self.connection.settimeout(None)
            return True
        except OSError:
            return False


def _dumps(answer: tuple[str, Any, str]) -> bytes:
    try:
        return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)  # (most answers: faster)
    except Exception:  # noqa: BLE001 - a class defined in the notebook: by value
        pass
    try:
        return cloudpickle.dumps(answer)
    except Exception as error:  # noqa: BLE001 - a value that cannot travel: said instead
        kind, value, printed = answer
        return cloudpickle.dumps(("raise", TypeError(
            f"the detached pool cannot send back {type(value).__name__}: {error}"), printed))


def _portable(error: BaseException) -> BaseException:
    """``error`` if the kernel can rebuild it, else a ``RuntimeError`` (or ``KeyboardInterrupt``
    subclass kept as such) with its text."""
    try:
        pickle.loads(cloudpickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any failure to rebuild: its text travels
        text = f"{type(error).__name__}: {error}"
        return KeyboardInterrupt(text) if isinstance(error, KeyboardInterrupt) else RuntimeError(text)
