"""What travels between the kernel and the workers: the payload in, results out.

The function, its args and kwargs are serialised with cloudpickle, so functions and
classes defined in the notebook travel by value. When something cannot be
serialised we find *where* it is (``args[0].lock``) and say so before any worker
starts. One exception: ``multiprocessing`` queues, locks, events... refuse
pickling because they "should only be shared between processes through
inheritance"; under ``fork`` the payload is then handed over as it is (an
``InheritedPayload``), so they work as with the peer's launcher. Big CPU tensors
travel as shared memory when the caller gives a :class:`SharedTensors`.
"""

from __future__ import annotations

import collections
import io
import linecache
import marshal
import os
import pickle
import sys
import types
from typing import Any

import cloudpickle

from notebook_accel.launch.handoff import tensor_bytes
from notebook_accel.launch.handoff.cells import NUMBERS, SentCells, compiled_cells
from notebook_accel.launch.handoff.rank_identity import (
    RankBoundError,
    advice,
    rank_bound_kind,
    rank_bound_types,
)
from notebook_accel.launch.handoff.shared_tensors import SharedTensors

_MAX_DEPTH = 12
# Built-in types no rank-bound class can be (none subclasses them): most of what a payload
# holds, checked without an isinstance against classes whose metaclass answers in Python
_NEVER_RANK_BOUND = frozenset({
    types.FunctionType, types.CodeType, types.CellType, types.ModuleType, types.MethodType,
    types.BuiltinFunctionType, dict, tuple, list, set, frozenset, str, bytes, int, float, bool,
    type(None)})
_MAX_SOURCE_BYTES = 4 << 20


class InheritedPayload:
    """``(function, args, kwargs)`` that forked workers inherit instead of unpickling."""

    def __init__(self, function: Any, args: tuple, kwargs: dict) -> None:
        self.function, self.args, self.kwargs = function, tuple(args), dict(kwargs)


Payload = bytes | InheritedPayload  # what the workers get


def serialise_payload(function: Any, args: tuple, kwargs: dict, inherit: bool = False,
                      shared: SharedTensors | None = None,
                      sent: SentCells | None = None) -> Payload:
    """Serialise ``(function, args, kwargs)`` plus the notebook cells' sources and numbers.

    Args:
        inherit: the workers are forked: a payload holding ``multiprocessing`` objects
            (which only travel by inheritance) is inherited instead.
        shared: big CPU tensors go into its shared memory (the workers map one copy);
            close it once the workers have run.
        sent: what these workers already have of the notebook's cells (warm workers keep
            them); only the rest is sent, and added to it.

    Raises:
        TypeError: a value cannot be serialised (and cannot be inherited); the message names its path.
    """
    try:
        sent = sent if sent is not None else SentCells()
        (names, last), (numbers, mark) = sent.unread_files(), sent.new_numbers()
        sources, left = _cell_sources(names, sent.sources)
        data = _dumps((function, tuple(args), dict(kwargs), sources, numbers), _OutboundPickler,
                      shared=shared)
        sent.sent(sources, numbers, mark, (last, left))
        return data
    except RankBoundError as exc:
        where = _locate_rank_bound(exc.value, function, args, kwargs)
        raise TypeError(
            f"cannot send {where} to the workers: {advice(exc.kind)}. Create it inside the "
            "function instead (each worker builds its own, e.g. accelerator = Accelerator())"
        ) from None
    except Exception as exc:  # cloudpickle raises TypeError, PicklingError, AttributeError...
        if inherit and isinstance(exc, RuntimeError) and "through inheritance" in str(exc):
            return InheritedPayload(function, args, kwargs)
        where, error = _locate_failure(function, args, kwargs) or ("the payload", exc)
        raise TypeError(
            f"cannot send {where} to the workers: {type(error).__name__}: {error}. "
            "Create it inside the function instead, or pass something that can be pickled."
        ) from None


def _code_reduce(code: types.CodeType):
    """A code object as ``marshal`` writes it (what a ``.pyc`` holds: nested code and the real file
    name, so worker tracebacks point into the notebook cell; 5x faster than cloudpickle's field by
    field); cloudpickle's way for one whose constants ``marshal`` cannot write, keeping its file name
    (cloudpickle renames it ``<dynamic-code>``)."""
    try:
        return marshal.loads, (marshal.dumps(code),)
    except ValueError:
        constructor, args = _cloudpickle_code_reduce(code)
        return constructor, tuple(code.co_filename if arg == "<dynamic-code>" else arg for arg in args)


_cloudpickle_code_reduce = cloudpickle.cloudpickle._code_reduce


class _PayloadPickler(cloudpickle.CloudPickler):
    """cloudpickle, keeping code objects' file names, with plain CPU tensors as their bytes
    (:mod:`.tensor_bytes`)."""

    dispatch_table = collections.ChainMap(
        {types.CodeType: _code_reduce}, cloudpickle.CloudPickler.dispatch_table
    )

    def reducer_override(self, obj):
        if type(obj) not in _NEVER_RANK_BOUND:  # (none of those is a tensor either)
            reduced = tensor_bytes.reduce(obj)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)


class _OutboundPickler(_PayloadPickler):
    """Kernel -> workers: refuses rank-bound objects (:mod:`.rank_identity`), and sends big
    CPU tensors through shared memory when given a :class:`SharedTensors`."""

    def __init__(self, file: Any, protocol: int, shared: SharedTensors | None = None) -> None:
        super().__init__(file, protocol=protocol)
        self.shared = shared
        self.rank_bound = rank_bound_types()
        self.rank_bound_classes = tuple(cls for cls, _ in self.rank_bound)  # one check per object

    def reducer_override(self, obj):
        if type(obj) not in _NEVER_RANK_BOUND and isinstance(obj, self.rank_bound_classes):
            raise RankBoundError(rank_bound_kind(obj, self.rank_bound), obj)
        reduced = self.shared.reduce(obj) if self.shared is not None else None
        return reduced if reduced is not None else super().reducer_override(obj)


def _dumps(obj: Any, pickler_class: type = _PayloadPickler, **options: Any) -> bytes:
    buffer = io.BytesIO()
    pickler_class(buffer, protocol=pickle.HIGHEST_PROTOCOL, **options).dump(obj)
    return buffer.getvalue()


def load_payload(data: Payload) -> tuple[Any, tuple, dict]:
    """Inverse of :func:`serialise_payload`; registers the shipped cells' sources (``linecache``)
    and numbers (``cells.NUMBERS``)."""
    if isinstance(data, InheritedPayload):
        return data.function, data.args, data.kwargs
    try:
        function, args, kwargs, sources, numbers = pickle.loads(data)
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"{error}, which the kernel imported the function or an argument from. Functions and "
            "classes defined in the notebook travel by value; imported ones travel by reference, so "
            f"{error.name!r} must be importable where the workers run (installed on every node, or "
            "on its PYTHONPATH); or define them in the notebook", name=error.name) from None
    for filename, entry in sources.items():
        linecache.cache.setdefault(filename, entry)
    NUMBERS.update(numbers)
    return function, args, kwargs


def _cell_sources(names: list[str], skip: set[str]) -> tuple[dict[str, tuple], tuple[str, ...]]:
    """linecache entries of notebook cells (they exist in memory only), for tracebacks, among
    ``names`` (``SentCells.unread_files``: a payload of a long session looks only at what is
    new); real files (the worker reads them itself) join ``skip``. Returns the sources and the
    names left to read again (an entry not read yet, a source over the budget)."""
    sources, left, total, cells = {}, [], 0, compiled_cells()
    for index, filename in enumerate(names):
        entry = linecache.cache.get(filename)
        if entry is None:
            continue  # dropped: one that comes back is read then
        if len(entry) != 4:
            left.append(filename)  # a lazy entry: read once it holds its lines
            continue
        if (entry[1] is not None and filename not in cells) or os.path.exists(filename):
            skip.add(filename)  # a real file
            continue
        size = sum(len(line) for line in entry[2])
        if total + size > _MAX_SOURCE_BYTES:
            left += names[index:]
            break
        # No modification time: linecache.checkcache keeps it (IPython 7's cells have one).
        sources[filename], total = (entry[0], None, entry[2], entry[3]), total + size
    return sources, tuple(left)


def _picklable(obj: Any) -> Exception | None:
    try:
        _dumps(obj)
    except Exception as exc:
        return exc
    return None


def _children(obj: Any, path: str):
    """(path, value) pairs of the parts of ``obj`` that cloudpickle serialises."""
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        for name, cell in zip(code.co_freevars, obj.__closure__ or (), strict=False):
            try:
                yield f"{path} (closure variable {name!r})", cell.cell_contents
            except ValueError:  # empty cell
                continue
        for name in _global_names(code):
            if name in obj.__globals__:
                yield f"{path} (global {name!r})", obj.__globals__[name]
        for i, value in enumerate(obj.__defaults__ or ()):
            yield f"{path} (default {i})", value
        for name, value in (obj.__kwdefaults__ or {}).items():
            yield f"{path} (default {name!r})", value
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield f"{path}[{key!r}]", value
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(obj):
            yield f"{path}[{i}]", value
    else:
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            for key, value in state.items():
                yield f"{path}.{key}", value
        for cls in type(obj).__mro__:
            for key in getattr(cls, "__slots__", ()):
                if isinstance(key, str) and hasattr(obj, key):
                    yield f"{path}.{key}", getattr(obj, key)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _locate(obj: Any, path: str, depth: int, seen: set[int]) -> tuple[str, Exception] | None:
    error = _picklable(obj)
    if error is None:
        return None
    if depth < _MAX_DEPTH and id(obj) not in seen and not isinstance(obj, types.ModuleType):
        seen.add(id(obj))
        for child_path, child in _children(obj, path):
            found = _locate(child, child_path, depth + 1, seen)
            if found is not None:
                return found
    return path, error


def _roots(function: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    name = getattr(function, "__name__", "function")
    roots = [(f"function {name!r}", function)]
    roots += [(f"args[{i}]", value) for i, value in enumerate(args)]
    return roots + [(f"kwargs[{key!r}]", value) for key, value in kwargs.items()]


def _locate_failure(function: Any, args: tuple, kwargs: dict) -> tuple[str, Exception] | None:
    seen: set[int] = set()
    for path, value in _roots(function, args, kwargs):
        found = _locate(value, path, 0, seen)
        if found is not None:
            return found
    return None


def _find(target: Any, obj: Any, path: str, depth: int, seen: set[int]) -> str | None:
    if obj is target:
        return path
    if depth >= _MAX_DEPTH or id(obj) in seen or isinstance(obj, types.ModuleType):
        return None
    seen.add(id(obj))
    for child_path, child in _children(obj, path):
        found = _find(target, child, child_path, depth + 1, seen)
        if found is not None:
            return found
    return None


def _locate_rank_bound(target: Any, function: Any, args: tuple, kwargs: dict) -> str:
    """The path to ``target`` in what is sent (``args[0].accelerator``), or ``the payload``."""
    seen: set[int] = set()
    for path, value in _roots(function, args, kwargs):
        found = _find(target, value, path, 0, seen)
        if found is not None:
            return found
    return "the payload"


def check_sendable(value: Any) -> str | None:
    """What rank-bound object ``value`` holds and where, as a path from ``value``
    (``"an Accelerator (at [1]['a'])"``; ``"an Accelerator"`` for ``value`` itself); None
    when it holds none. Pickles ``value`` to nowhere.

    Raises:
        Exception: whatever pickling ``value`` raises (it cannot be sent at all).
    """
    try:
        _OutboundPickler(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except RankBoundError as exc:
        where = _find(exc.value, value, "", 0, set())
        return exc.kind + (f" (at {where})" if where else "")
    return None


class _Discard:
    """A file that throws away what is written: checking costs no memory."""

    @staticmethod
    def write(data: bytes) -> int:
        return len(data)


class _ResultPickler(_PayloadPickler):
    """Moves tensors to the CPU and unwraps DDP models on the way out of a worker (FSDP ones are refused)."""

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if torch is not None:
            if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
                return obj.detach().cpu().__reduce_ex__(self.proto)
            ddp = torch.nn.parallel.DistributedDataParallel
            if isinstance(obj, ddp):
                return _identity, (obj.module,)
            fsdp = sys.modules.get("torch.distributed.fsdp")
            if fsdp is not None and isinstance(obj, fsdp.FSDPModule):
                raise TypeError(f"a {type(obj).__name__} sharded by FSDP cannot leave its worker (its weights "
                                "are spread over the processes); return accelerator.unwrap_model(model), a "
                                "full plain copy, or accelerator.get_state_dict(model) instead")
            engine = sys.modules.get("deepspeed.runtime.engine")
            if engine is not None and isinstance(obj, engine.DeepSpeedEngine):
                raise TypeError("a DeepSpeed engine cannot leave its worker (it holds the process group and, "
                                "under ZeRO, only this process's shards); return accelerator.unwrap_model(model) "
                                "or accelerator.get_state_dict(model) instead")
        return super().reducer_override(obj)


def _identity(value: Any) -> Any:
    return value


def dumps_result(value: Any) -> bytes:
    """Serialise a worker's return value for the kernel (tensors on CPU)."""
    return _dumps(value, _ResultPickler)
