"""A read selector whose ``select`` returns at most ``most`` ready channels.

The watch loop of a 1024-rank launch registers thousands of descriptors; when every rank
prints at once, all of them are ready together, and a plain ``selectors`` selector hands back
every one of them in one call, a Python object each. With epoll the kernel can
be asked for a few: level-triggered, it puts a descriptor it reported back at the end of its
ready list, so successive calls go round every ready channel in turn. Where there is no epoll
(macOS), every ready channel is returned, as ``selectors`` does.
"""

from __future__ import annotations

import select
import selectors
from typing import Any


def _fd(channel: Any) -> int:
    return channel if isinstance(channel, int) else channel.fileno()


class BoundedSelector:
    """Channels registered for reading, each with its data; ``select`` gives the data of at
    most ``most`` ready ones. ``channel in selector`` and ``len(selector)`` tell what is
    registered (a channel is a descriptor or an object with ``fileno()``)."""

    def __init__(self) -> None:
        self._data: dict[int, Any] = {}
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._other = None if self._epoll else selectors.DefaultSelector()

    def register(self, channel: Any, data: Any) -> None:
        """Watch ``channel`` for reading; ``select`` gives ``data`` when it is ready.

        Raises:
            KeyError: ``channel`` is registered already.
        """
        fd = _fd(channel)
        if fd in self._data:
            raise KeyError(f"descriptor {fd} is registered already")
        if self._epoll:
            self._epoll.register(fd, select.EPOLLIN)
        else:
            self._other.register(fd, selectors.EVENT_READ, data)
        self._data[fd] = data

    def unregister(self, channel: Any) -> None:
        """Stop watching ``channel`` (it may be closed already).

        Raises:
            KeyError: ``channel`` is not registered.
        """
        fd = _fd(channel)
        del self._data[fd]
        if self._epoll:
            try:
                self._epoll.unregister(fd)
            except OSError:  # closed: the kernel forgot it with its last descriptor
                pass
        else:
            self._other.unregister(fd)

    def select(self, timeout: float | None = None, most: int | None = None) -> list[Any]:
        """The data of ready channels, at most ``most`` of them (all, without epoll), waiting
        up to ``timeout`` seconds (None: until one is ready; 0: not at all)."""
        if not self._epoll:
            return [key.data for key, _ in self._other.select(timeout)]
        wait = -1 if timeout is None else max(timeout, 0.0)
        ready = self._epoll.poll(wait, most or max(len(self._data), 1))
        return [self._data[fd] for fd, _ in ready if fd in self._data]

    def __contains__(self, channel: Any) -> bool:
        return _fd(channel) in self._data

    def __len__(self) -> int:
        return len(self._data)

    def close(self) -> None:
        self._data.clear()
        if self._epoll:
            self._epoll.close()
        else:
            self._other.close()

    def __enter__(self) -> BoundedSelector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
