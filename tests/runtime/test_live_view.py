"""The live view's cost with long histories (600,000 points rendered, then redrawn): seconds on a
busy machine (tests/unit/test_live_view_units.py has the rest)."""

from __future__ import annotations

import math
import time

from magics.view.live_view import render
from magics.view.plots import Plots
from tests.unit.test_live_view_units import make_record


def test_redraws_stay_cheap_with_long_histories():
    record = make_record(age=5.0, ranks=8)
    view_plots = Plots()
    for name in ("loss", "acc", "lr"):
        record.history[name] = [(i, math.cos(i / 50)) for i in range(200_000)]
    render(record, view_plots)
    for name in record.history:
        record.history[name].extend((i, 0.5) for i in range(200_000, 200_100))
    start = time.perf_counter()
    bundle = render(record, view_plots)
    assert time.perf_counter() - start < 0.1  # re-reading everything takes ~1 s
    assert bundle["text/html"].count("<svg") == 3 and len(bundle["text/html"]) < 60_000
