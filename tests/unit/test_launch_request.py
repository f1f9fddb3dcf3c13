"""``LaunchRequest``: what each front door was given, checked by the options' rows."""

from __future__ import annotations

import pytest

from notebook_accel.launch.request import LaunchRequest


def _keywords(door="notebook_launcher", **options):
    return dict(LaunchRequest.from_keywords(door, options))


def test_the_peers_defaults_given_explicitly_are_taken():
    assert _keywords(rdzv_backend="static", rdzv_endpoint="", max_restarts=0, use_port="29500",
                     monitor_interval=0.1) == {"rdzv_backend": "static", "rdzv_endpoint": "",
                                               "max_restarts": 0, "use_port": 29500,
                                               "monitor_interval": 0.1}


def test_none_is_not_given_except_where_it_is_a_value():
    assert _keywords(num_processes=None, hang_after=None) == {"hang_after": None}  # never


def test_each_door_names_what_it_does_not_take():
    with pytest.raises(TypeError, match="unknown option 'num_proceses'; did you mean 'num_processes'"):
        _keywords(num_proceses=2)
    with pytest.raises(TypeError, match="WorkerPool does not take rdzv_backend: a pool uses its own"):
        _keywords("WorkerPool", rdzv_backend="c10d")
    with pytest.raises(TypeError, match="notebook_launcher does not take stop_wait"):
        _keywords(stop_wait=1.0)
    assert _keywords("WorkerPool", stop_wait=2) == {"stop_wait": 2.0}


def test_flags_are_named_in_their_errors_and_kept_as_sources():
    request = LaunchRequest.from_flags({"use_port": 29400, "num_processes": None}, "cli")
    assert dict(request) == {"use_port": 29400} and request.source("use_port") == "flag --main-process-port"
    with pytest.raises(ValueError, match="^flag --port: use_port=0 must be an integer from 1 to 65535$"):
        LaunchRequest.from_flags({"use_port": 0}, "magic")
