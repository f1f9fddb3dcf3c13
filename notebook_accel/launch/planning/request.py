"""One launch request: the options a front door was given, checked against the table, each
with where it came from.

Every front door builds one (``notebook_launcher``'s keywords, ``WorkerPool``'s, the
``%%accelerate`` magic's flags, the ``notebook-accel`` command's) and the plan reads only it
(``launcher.plan_launch``). The options are the table's rows (``contract.OPTIONS``) and the
strategies' (``strategies/registry.py``), read at each call, so a row is all a new option needs
to reach every door; ``notebook_launcher``'s signature is made from them too.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from notebook_accel import contract
from notebook_accel.contract import LaunchOption
from notebook_accel.strategies import registry


def launch_options() -> dict[str, LaunchOption]:
    """Every launch option by name: the table's, then the strategies' (``fsdp``, ``deepspeed``)."""
    return {**contract.OPTIONS, **registry.launch_options()}


def door_options(door: str) -> dict[str, LaunchOption]:
    """The options ``door`` (``"notebook_launcher"`` or ``"WorkerPool"``) takes."""
    pool = door == "WorkerPool"
    return {name: o for name, o in launch_options().items()
            if o.argument and (o.not_for_pool is None if pool else not o.pool_only)}


def launcher_signature() -> inspect.Signature:
    """``notebook_launcher``'s signature: ``function``, ``args``, the positional options (the
    peer's order), then ``kwargs`` and the other options, keyword-only. An option that a layer
    below the argument can set (environment, file) defaults to None (unset), others to their
    default. Made once per set of option rows (a strategy registered later adds its own)."""
    return _signature(tuple(door_options("notebook_launcher").values()))


@functools.cache
def _signature(options: tuple[LaunchOption, ...]) -> inspect.Signature:
    kinds = inspect.Parameter

    def parameter(option: LaunchOption, kind: Any) -> inspect.Parameter:
        default = None if option.env or option.file_key else option.default
        return kinds(option.name, kind, default=default,
                     annotation=Any if option.kind is object else option.kind | None)

    params = [kinds("function", kinds.POSITIONAL_OR_KEYWORD),
              kinds("args", kinds.POSITIONAL_OR_KEYWORD, default=()),
              *(parameter(o, kinds.POSITIONAL_OR_KEYWORD) for o in options if o.positional),
              kinds("kwargs", kinds.KEYWORD_ONLY, default=None),
              *(parameter(o, kinds.KEYWORD_ONLY) for o in options if not o.positional)]
    return inspect.Signature(params)


def _unknown(name: str, door: str, takes: Mapping[str, LaunchOption]) -> TypeError:
    option = launch_options().get(name)
    if option is not None and option.argument:
        why = option.not_for_pool if door == "WorkerPool" else "it is WorkerPool's only"
        return TypeError(f"{door} does not take {name}: {why}")
    close = difflib.get_close_matches(name, list(takes), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return TypeError(f"{door} got an unknown option {name!r}; {hint}valid options: "
                     f"{', '.join(takes)}")


class LaunchRequest(Mapping[str, Any]):
    """The options given (name -> checked value; one not given is absent), and where each came
    from (:meth:`source`: None for an argument, ``"flag --port"`` for a flag). A front door
    that built one hands it over as it is (``launcher.launch_request``,
    ``WorkerPool.from_request``), so its values are not checked again and keep their sources;
    as a Mapping, ``notebook_launcher(fn, **request)`` also takes it, as arguments."""

    def __init__(self, values: Mapping[str, Any], sources: Mapping[str, str | None] | None = None):
        self._values = dict(values)
        self._sources = dict(sources or {})

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"LaunchRequest({self._values!r})"

    def source(self, name: str) -> str | None:
        """Where ``name``'s value came from: None for an argument, else ``"flag --x"``."""
        return self._sources.get(name)

    def replaced(self, **values: Any) -> LaunchRequest:
        """A copy with ``values`` set (None: not given), as arguments."""
        kept = {k: v for k, v in {**self._values, **values}.items() if v is not None}
        return LaunchRequest(kept, {k: v for k, v in self._sources.items() if k not in values})

    def updated(self, other: LaunchRequest) -> LaunchRequest:
        """A copy with ``other``'s options over these, each keeping where it came from (a pool
        started with ``-n 2`` and restarted with ``--hang-after 5``: both, as flags)."""
        sources = {k: v for k, v in self._sources.items() if k not in other._values}
        return LaunchRequest({**self._values, **other._values}, {**sources, **other._sources})

    @classmethod
    def from_keywords(cls, door: str, options: Mapping[str, Any]) -> LaunchRequest:
        """``door``'s keyword arguments, checked (a None is "not given", except where it is a
        value: ``hang_after=None``).

        Raises:
            TypeError: an option ``door`` does not take (the closest one named), or a mistyped value.
            ValueError: a bad value, naming it and the valid values.
        """
        takes = door_options(door)
        for name in options:
            if name not in takes:
                raise _unknown(name, door, takes)
        return cls({name: value if value is None else takes[name].check(value)
                    for name, value in options.items()
                    if value is not None or takes[name].nullable})

    @classmethod
    def from_call(cls, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any, LaunchRequest]:
        """``notebook_launcher``'s call, bound to :func:`launcher_signature`:
        ``(function, args, kwargs, request)``.

        Raises:
            TypeError: as Python does for a call that does not fit the signature; see
                :meth:`from_keywords` for the options.
        """
        takes = door_options("notebook_launcher")
        for name in kwargs:
            if name not in takes and name not in ("function", "args", "kwargs"):
                raise _unknown(name, "notebook_launcher", takes)
        given = launcher_signature().bind(*args, **kwargs).arguments
        function, call_args = given.pop("function"), given.pop("args", ())
        call_kwargs = given.pop("kwargs", None)
        return function, call_args, call_kwargs, cls.from_keywords("notebook_launcher", given)

    def for_door(self, door: str) -> LaunchRequest:
        """This request, for ``door`` (``"notebook_launcher"`` or ``"WorkerPool"``): its values
        are not checked again (they were, where they entered), only that ``door`` takes each.

        Raises:
            TypeError: an option ``door`` does not take, as :meth:`from_keywords` says it.
        """
        takes = door_options(door)
        for name in self._values:
            if name not in takes:
                raise _unknown(name, door, takes)
        return self

    @classmethod
    def from_flags(cls, values: Mapping[str, Any], front: str) -> LaunchRequest:
        """Parsed flags (option name -> value; None: not given) of ``front`` (``"magic"`` or
        ``"cli"``), each checked and named by its flag when bad.

        Raises:
            ValueError: ``flag --num-processes: num_processes=0 must be an integer >= 1``.
        """
        options = launch_options()
        checked, sources = {}, {}
        for name, value in values.items():
            if value is None:
                continue
            option = options[name]
            flag = option.magic_flag if front == "magic" else option.cli_flag
            sources[name] = f"flag {flag}"
            checked[name] = option.check(value, sources[name])
        return cls(checked, sources)
