"""``notebook_accel.observe.progress.tqdm``: Accelerate's semantics, and events instead of bars in workers."""

from __future__ import annotations

import pytest
from tqdm.std import tqdm as std_tqdm

from notebook_accel.observe.progress import EventTqdm, tqdm


def test_outside_a_launcher_it_is_an_ordinary_tqdm(capsys):
    bar = tqdm(range(7), desc="plain")
    assert isinstance(bar, std_tqdm) and not isinstance(bar, EventTqdm)
    assert len(bar) == 7
    assert list(bar) == list(range(7))
    assert "7/7" in capsys.readouterr().err  # it draws itself as usual
    with tqdm(total=3) as manual:
        manual.update(2)
        manual.set_postfix(loss=0.5)
        assert manual.n == 2


def test_main_process_only_disables_the_bar_on_other_ranks(monkeypatch, capsys):
    monkeypatch.setenv("LOCAL_RANK", "1")
    bar = tqdm(range(4))
    assert bar.disable and list(bar) == [0, 1, 2, 3] and len(bar) == 4
    assert tqdm(range(4), main_process_only=False).disable is False
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert tqdm(range(4)).disable is False
    assert tqdm(range(4), disable=True).disable is True
    capsys.readouterr()


def test_old_positional_flag_is_refused():
    with pytest.raises(ValueError, match="main_process_only"):
        tqdm(True, range(3))


def test_event_bar_state_is_small_plain_data():
    bar = EventTqdm(range(5), desc="x" * 1000, unit="batch")
    for _ in bar:
        pass
    state = bar.state(closed=True)
    assert state["n"] == 5 and state["total"] == 5 and state["unit"] == "batch"
    assert len(state["desc"]) == 200 and state["closed"] is True and state["rate"] > 0


def _train():
    import sys
    import time

    from notebook_accel import events
    from notebook_accel.observe.progress import EventTqdm, tqdm

    kinds = []
    for _ in tqdm(range(4), desc="everyone", main_process_only=False):
        time.sleep(0.01)
    bar = tqdm(range(30), desc="main only")
    kinds.append(type(bar).__name__)
    for step in bar:
        bar.set_postfix(step=step)
        time.sleep(0.01)
    print("done", file=sys.stderr, flush=True)
    return events.active(), kinds, isinstance(bar, EventTqdm)


def test_in_launched_workers_progress_goes_to_the_kernel_as_events(capfd):
    from notebook_accel import notebook_launcher
    from notebook_accel.launch.views.record import last_launch

    results = notebook_launcher(_train, num_processes=2, return_all=True)
    assert results == [(True, ["EventTqdm"], True)] * 2
    progress = last_launch().progress
    assert progress[0]["desc"] == "main only" and progress[0]["n"] == 30
    assert progress[0]["total"] == 30 and progress[0]["closed"] is True
    assert progress[0]["postfix"] == "step=29"
    assert progress[1]["desc"] == "everyone" and progress[1]["n"] == 4  # rank 1: main only off
    relayed = [line for line in capfd.readouterr().err.splitlines() if line.startswith("[rank")]
    assert "[rank 0] done" in relayed
    assert not any("it/s" in line or "30/30" in line for line in relayed)  # workers draw no bar


def test_nested_bars_report_once_through_the_innermost(monkeypatch):
    from notebook_accel import events
    from notebook_accel.observe.progress import bar_label

    sent = []
    monkeypatch.setattr(events, "emit", lambda kind, data, key=None: sent.append(data) or True)
    for _ in EventTqdm(range(2), desc="epoch", mininterval=0):
        for _ in EventTqdm(range(3), desc="step", mininterval=0):
            pass
    inner = [s for s in sent if s["desc"] == "step"]
    outer = [s for s in sent if s["desc"] == "epoch"]
    assert inner and all(s["outer"][0]["desc"] == "epoch" for s in inner)
    assert bar_label(inner[-1]) == "epoch 1/2 · step"
    # the outer bar only reports between inner bars, never while one is open
    assert [(s["desc"], s["n"], s["closed"]) for s in sent] == [
        ("epoch", 0, False),
        ("step", 1, False), ("step", 2, False), ("step", 3, False), ("step", 3, True),
        ("epoch", 1, False),
        ("step", 1, False), ("step", 2, False), ("step", 3, False), ("step", 3, True),
        ("epoch", 2, False), ("epoch", 2, True),
    ]
    assert all(s["outer"] == [] for s in outer)
