"""``LaunchRequest``: what each front door was given, checked by the options' rows."""

from __future__ import annotations

import pytest

from notebook_accel.launch.planning.request import LaunchRequest


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


def test_a_default_outside_the_valid_values_is_taken_only_where_its_row_says_so():
    """No shortcut in the checker: a row whose default is a sentinel (0: "auto") refuses it as a
    value unless the row says its default is one (``rdzv_endpoint=""``, the peer's default)."""
    from notebook_accel.contract import OPTIONS, LaunchOption

    sentinel = LaunchOption("workers", int, "workers (0: auto)", low=1, default=0)
    with pytest.raises(ValueError, match="^workers=0 must be an int >= 1$"):
        sentinel.check(0)
    with pytest.raises(ValueError, match="^flag --workers: workers=0 must be an integer >= 1$"):
        sentinel.check(0, "flag --workers")
    assert LaunchOption("workers", int, "h", low=1, default=0, default_valid=True).check(0) == 0
    assert OPTIONS["rdzv_endpoint"].default_valid and OPTIONS["rdzv_endpoint"].check("") == ""
    with pytest.raises(ValueError, match="^master_addr='' must be a host name or IP address$"):
        OPTIONS["master_addr"].check("")


def test_each_option_is_checked_once_where_it_enters_and_a_pool_fills_them_once(monkeypatch):
    """The request checks an argument, the environment's reader its variable; neither the fill
    nor ``make_plan`` checks them again, and ``WorkerPool`` fills the options once per plan."""
    from notebook_accel.contract import LaunchOption
    from notebook_accel.launch.pools import pool

    checked, fills = [], []
    check, fill = LaunchOption.check, pool.fill_options
    monkeypatch.setattr(LaunchOption, "check",
                        lambda self, value, *a, **k: checked.append(self.name) or check(self, value, *a, **k))
    monkeypatch.setattr(pool, "fill_options", lambda *a, **k: fills.append(1) or fill(*a, **k))
    monkeypatch.setenv("NOTEBOOK_ACCEL_START_METHOD", "fork")
    plan = pool.WorkerPool._plan({"num_processes": 1, "device": "cpu"})  # the plan; no worker
    assert (plan.num_processes, plan.device_type, plan.start.method) == (1, "cpu", "fork")
    assert {"device", "num_processes", "start_method"} <= set(checked)  # (and the file's values)
    assert sorted(checked) == sorted(set(checked)) and fills == [1]  # each once


def test_notebook_launchers_signature_is_made_once_and_binds_every_call():
    """The signature is made once for the option rows (not at every call), and a call binds
    to it as Python binds one: positional options in the peer's order, its errors as Python's."""
    from notebook_accel.launch.planning import request as requestmod

    LaunchRequest.from_call(print, (), 2)
    made = requestmod._signature.cache_info().misses
    function, args, kwargs, request = LaunchRequest.from_call(print, (1,), 2, "BF16", kwargs={"a": 1},
                                                              device="cpu")
    assert requestmod._signature.cache_info().misses == made  # no new signature for a call
    assert (function, args, kwargs) == (print, (1,), {"a": 1})
    assert dict(request) == {"num_processes": 2, "mixed_precision": "bf16", "device": "cpu"}
    with pytest.raises(TypeError, match="multiple values for argument 'num_processes'"):
        LaunchRequest.from_call(print, (), 2, num_processes=2)
    with pytest.raises(TypeError, match="too many positional arguments"):
        LaunchRequest.from_call(print, (), *range(14))
    with pytest.raises(TypeError, match="unknown option 'num_proceses'"):
        LaunchRequest.from_call(print, (), num_proceses=2)
