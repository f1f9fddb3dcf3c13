"""One rule for logger names: a module of ours that logs what a peer module logs is heard under that
peer module's logger name as well (``notebook_accel._peer_paths.PEER_LOGGERS``), so a user's
``logging.getLogger("accelerate")`` settings reach our warnings, and ours keep working."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator

import pytest

from notebook_accel._peer_paths import PEER_LOGGERS
from notebook_accel.runtime.helpers import convert_dict_to_env_variables

BAD = {"BAD_ENV_NAME": "<mything", "OTHER_ENV": "2"}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def listen() -> Iterator:
    """``listen(name)``: a handler on that logger; every logger touched is restored afterwards."""
    touched: list[tuple[logging.Logger, logging.Handler, int, bool]] = []

    def add(name: str) -> _Records:
        logger, handler = logging.getLogger(name), _Records()
        touched.append((logger, handler, logger.level, logger.propagate))
        logger.addHandler(handler)
        return handler

    yield add
    for logger, handler, level, propagate in touched:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def test_a_handler_on_the_peers_logger_sees_our_warning_once_as_do_ours(listen):
    peer, ours, root = listen("accelerate"), listen("notebook_accel"), listen("")
    assert convert_dict_to_env_variables(BAD) == ["OTHER_ENV=2\n"]
    for handler in (peer, ours, root):
        assert [r.getMessage() for r in handler.records] == [
            "Skipping BAD_ENV_NAME=<mything: empty, or holds one of (';', '\\n', '<', '>', ' ')"]
    assert peer.records[0].name == "notebook_accel.runtime.helpers"  # the record says where it comes from


def test_the_peers_own_check_sees_it_on_the_peers_module_logger():
    # the peer's test_convert_dict_to_env_variables, as it is written
    with pytest.raises(AssertionError), _case().assertLogs("accelerate.utils.environment", level="WARNING"):
        pass  # a logger with no record fails assertLogs (sanity)
    with _case().assertLogs("accelerate.utils.environment", level="WARNING") as seen:
        convert_dict_to_env_variables(BAD)
    assert len(seen.records) == 1


def test_a_level_on_the_peers_logger_silences_ours_everywhere(listen):
    root, ours, peer = listen(""), listen("notebook_accel"), listen("accelerate")
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    convert_dict_to_env_variables(BAD)
    assert root.records == ours.records == peer.records == []


def test_the_peers_propagate_false_stops_our_record_there(listen):
    peer, root = listen("accelerate"), listen("")
    logging.getLogger("accelerate").propagate = False  # a user's own handler, without duplicates
    convert_dict_to_env_variables(BAD)
    assert len(peer.records) == 1 and root.records == []


@pytest.mark.parametrize("module", sorted(PEER_LOGGERS))
def test_every_logging_module_of_ours_in_the_table_uses_the_rule(module):
    logger = importlib.import_module(module).__dict__.get("logger", logging.getLogger(module))
    assert logger.name == module
    assert any(getattr(f, "peer", None) == PEER_LOGGERS[module] for f in logger.filters)


def _case():
    import unittest

    return unittest.TestCase()


def test_no_module_of_ours_logs_outside_the_rule():
    from pathlib import Path

    import notebook_accel

    root = Path(notebook_accel.__file__).parent
    plain = [str(p.relative_to(root)) for p in root.rglob("*.py") if "logging.getLogger(__name__)" in p.read_text()]
    assert plain == []  # each uses peer_logger(__name__), its peer name in PEER_LOGGERS
