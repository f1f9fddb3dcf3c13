"""The live view and the text view on hand-made launch records (no kernel, no workers)."""

from __future__ import annotations

import io
import math
import re
import time

from magics.view.live_view import LiveView, render
from magics.view.plots import MAX_POINTS, Plots, Series, metric_svg
from notebook_accel.launch.views import GuardedView
from notebook_accel.launch.views.record import LaunchRecord, RankStatus
from notebook_accel.launch.views.text import TextView
from notebook_accel.observe.progress import job_progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Screen:
    """Stands for IPython's display(): remembers the first bundle and every update."""

    def __init__(self) -> None:
        self.bundles: list[dict[str, str]] = []

    def __call__(self, bundle):
        self.bundles.append(bundle)
        return self

    def update(self, bundle, raw=False):
        assert raw
        self.bundles.append(bundle)


def make_record(age: float = 0.0, ranks: int = 2) -> LaunchRecord:
    record = LaunchRecord(world_size=ranks, num_processes=ranks, device_type="cpu",
                          start_method="fork", mixed_precision="bf16",
                          started=time.time() - age)
    for rank in range(ranks):
        record.ranks[rank] = RankStatus(rank=rank, pid=1000 + rank, state="running",
                                        started=record.started, rss=123_000_000)
    return record


def test_trivial_job_shows_nothing():
    screen = Screen()
    record = make_record(age=0.0)
    view = LiveView(record, display=screen)
    for _ in range(5):
        view.update(record)
    record.finish("finished")
    view.update(record, final=True)
    assert screen.bundles == []


def test_appears_after_a_second_updates_in_place_throttled_and_ends_static():
    screen, clock = Screen(), Clock()
    record = make_record(age=0.5)
    view = LiveView(record, display=screen, clock=clock)
    view.update(record)
    assert screen.bundles == []  # not yet: under a second
    record.started -= 1.0
    for tick in range(30):  # 3 s of updates, ten a second
        clock.now = tick * 0.1
        record.history.setdefault("loss", []).append((tick, 1.0 / (tick + 1)))
        view.update(record)
    assert 6 <= view.draws <= 11, view.draws  # at most a few redraws a second
    record.ranks[1].state, record.ranks[1].exitcode = "failed", 3
    record.finish("failed")
    view.update(record, final=True)
    final = screen.bundles[-1]
    assert "failed after" in final["text/plain"]
    assert "rank 1: failed (exit 3)" in final["text/plain"]
    assert "loss" in final["text/plain"]
    # the summary's charts are images (an untrusted notebook's sanitiser strips inline SVG)
    assert '<img src="data:image/svg+xml;base64,' in final["text/html"]
    assert "<svg" not in final["text/html"]
    count = len(screen.bundles)
    view.update(record)
    view.update(record, final=True)
    assert len(screen.bundles) == count  # static after the summary


def test_header_and_table_show_settings_memory_and_last_line():
    record = make_record(age=2.0)
    record.ranks[0].last_line = "epoch 3 done"
    record.ranks[1].gpu_memory = 2_500_000_000
    bundle = render(record)
    plain, html = bundle["text/plain"], bundle["text/html"]
    assert "2 processes on cpu · fresh workers (fork) · mixed precision: bf16 · running" in plain
    assert "rank 0: running, pid 1000" in plain and "RSS 123.0 MB" in plain
    assert "GPU 2.5 GB" in plain and "epoch 3 done" in plain
    assert "<th" in html and ">GPU<" in html and "1001" in html


def test_the_header_says_whether_the_run_is_on_the_warm_pool_or_on_fresh_workers():
    fresh, pooled = make_record(age=2.0), make_record(age=2.0)
    pooled.warm_pool = True
    for record, said in ((fresh, "fresh workers (fork)"), (pooled, "on the warm pool (fork)")):
        bundle = render(record)
        assert f"on cpu · {said} · mixed precision" in bundle["text/plain"]
        assert f"on cpu · {said} · mixed precision" in bundle["text/html"]
        out, clock = io.StringIO(), Clock()
        view = TextView(record, stream=out, clock=clock)
        view.update(record)
        clock.now = 11.0
        view.update(record)  # a later status line: only the first one says it
        record.finish("finished")
        view.update(record, final=True)
        first, later, summary = out.getvalue().splitlines()
        assert re.match(r"\[notebook_accel\] 2\.\d s: 2 running \| " + re.escape(said), first), first
        assert said not in later and f"2 running | {said}" in summary, summary
    assert "warm pool" not in render(fresh)["text/plain"]


def test_worker_text_is_escaped():
    record = make_record(age=2.0)
    record.ranks[0].last_line = "<script>alert(1)</script>"
    record.progress[0] = {"n": 1, "total": 2, "desc": "<b>x</b>", "rate": 1.0, "elapsed": 1.0,
                          "postfix": "<i>", "time": time.time()}
    record.history["<img src=x>"] = [(0, 1.0)]
    html = render(record)["text/html"]
    assert "<script>" not in html and "<b>x" not in html and "<img" not in html
    assert "&lt;script&gt;" in html


def test_job_progress_is_the_slowest_rank_with_rate_and_eta():
    record = make_record(age=2.0)
    assert job_progress(record) is None
    record.progress[0] = {"n": 50, "total": 100, "rate": 10.0, "elapsed": 5.0}
    assert job_progress(record)["eta"] == 5.0
    record.progress[1] = {"n": 20, "total": 100, "rate": 5.0, "elapsed": 4.0}
    state = job_progress(record)
    assert state["rank"] == 1 and state["eta"] == 16.0
    html = render(record)["text/html"]
    assert "(rank 1)" in html and "20/100" in html and "width:20.0%" in html
    assert "20/100 [00:04<00:16" in render(record)["text/plain"]


def test_a_redraw_makes_the_progress_bar_again_only_when_the_bar_shown_has_news(monkeypatch):
    from magics.view import progress

    record = make_record(age=2.0)
    record.progress[0] = {"n": 50, "total": 100, "rate": 10.0, "elapsed": 5.0}
    made, line = [], progress.progress_line
    monkeypatch.setattr(progress, "progress_line", lambda state: made.append(state["n"]) or line(state))
    first = progress.progress_parts(record)
    assert progress.progress_parts(record) is first and made == [50]  # no news: kept
    record.progress[0] = {"n": 60, "total": 100, "rate": 10.0, "elapsed": 6.0}  # an event
    assert "60/100" in progress.progress_parts(record)[0] and made == [50, 60]
    record.outcome = "failed"  # the bar's colour
    assert "#d62728" in progress.progress_parts(record)[1] and made == [50, 60, 60]
    record.progress[1] = {"n": 90, "total": 100, "rate": 10.0, "elapsed": 6.0}
    assert "(rank 0)" in progress.progress_parts(record)[1]  # several bars: whose it is


def test_plots_thin_long_histories_and_skip_non_finite_values():
    points = [(step, math.sin(step / 1000)) for step in range(100_000)]
    points[500] = (500, float("nan"))
    points[70_000] = (70_000, 5.0)  # a spike survives the thinning
    plots = Plots()
    plots.update({"wave": points[:50_000]})
    plots.update({"wave": points})  # incremental: only the new points are read
    svg = metric_svg("wave", plots.series["wave"])
    drawn = re.search(r'points="([^"]+)"', svg).group(1).split()
    assert 2 < len(drawn) <= MAX_POINTS + 1
    assert "nan" not in svg.lower()
    assert "step 99999" in svg  # the last step is kept
    assert ">5</text>" in svg  # the top of the y axis is the spike
    assert "wave: -0.5072 at step 99999 (min -1, max 5, 100000 points)" in plots.text()
    single = Series()
    single.extend([(None, 2.0)])
    assert "<circle" in metric_svg("one", single)


def test_a_failing_display_never_breaks_the_job(capsys):
    def broken(bundle):
        raise RuntimeError("no frontend")

    record = make_record(age=2.0)
    view = GuardedView(LiveView(record, display=broken))
    view.update(record)
    view.update(record, final=True)
    assert capsys.readouterr().err.count("live view stopped (RuntimeError: no frontend)") == 1
    assert not view.holds_output  # output is never held for a view that is gone


def test_text_view_lines_on_state_changes_every_ten_seconds_and_at_the_end():
    out, clock = io.StringIO(), Clock()
    record = make_record(age=0.2)
    view = TextView(record, stream=out, clock=clock)
    view.update(record)
    assert out.getvalue() == ""  # quiet for the first second
    record.started -= 1.0
    record.history["loss"] = [(7, 0.25)]
    view.update(record)
    clock.now = 5.0
    view.update(record)  # nothing changed, not 10 s yet
    assert out.getvalue().count("\n") == 1
    record.ranks[1].state = "finished"
    view.update(record)
    clock.now = 16.0
    view.update(record)
    record.ranks[0].state = "finished"
    view.update(record)  # every rank ended: no status line, the summary follows
    record.finish("finished")
    view.update(record, final=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert all(line.startswith("[notebook_accel] ") for line in lines)
    assert "2 running" in lines[0] and "loss 0.25 @ step 7" in lines[0]
    assert "1 running, 1 finished" in lines[1]
    assert lines[3].startswith("[notebook_accel] finished in ") and "2 finished" in lines[3]


def test_text_view_is_silent_for_a_trivial_job():
    out = io.StringIO()
    record = make_record(age=0.1)
    view = TextView(record, stream=out)
    view.update(record)
    record.finish("finished")
    view.update(record, final=True)
    assert out.getvalue() == ""


def test_ranks_without_output_get_no_empty_box_and_only_the_root_cause_is_red():
    from magics.view.status import STATE_COLOURS, status_parts

    record = make_record(ranks=3)
    record.ranks[0].state, record.ranks[0].last_line = "stopped", ""
    record.ranks[1].state, record.ranks[1].last_line = "failed", "ValueError: boom"
    record.ranks[2].state, record.ranks[2].last_line = "failed", "Connection closed by peer"
    record.root_cause = 1
    _, html = status_parts(record)
    assert "<code></code>" not in html and "<code>ValueError: boom</code>" in html
    red = STATE_COLOURS["failed"]
    assert html.count(f"color:{red}") == 1 and "failed · root cause" in html


def test_plots_use_a_log_axis_over_two_decades_start_at_step_zero_and_smooth():
    import base64

    falling = [(step, 10.0 ** (-4 * step / 999)) for step in range(1000)]  # 4 decades
    plots = Plots()
    plots.update({"loss": falling, "flat": [(step, 1.0 + step % 3) for step in range(1000)]})
    loss_svg = metric_svg("loss", plots.series["loss"])
    assert "(log scale)" in loss_svg and "(log scale)" not in metric_svg("flat", plots.series["flat"])
    assert "step 0</text>" in loss_svg  # the first step survives the thinning
    assert 'class="smoothed"' in loss_svg and 'stroke-opacity="0.3"' in loss_svg
    labels = re.findall(r'text-anchor="end" font-size="9" fill="#555">([^<]+)<', loss_svg)
    assert labels[:2] == ["1", "0.0001"] and all(len(label) <= 7 for label in labels[:2])
    # drawn on a log axis, the half-way value sits half-way up the box
    top, bottom = 18, 140 - 20
    mid = [p for p in re.search(r'points="([^"]+)"', loss_svg)[1].split()
           if p.startswith(f"{58 + (300 - 58 - 8) * 500 / 999:.0f}")]
    assert mid and abs(float(mid[0].split(",")[1]) - (top + bottom) / 2) < 3, mid
    image = plots.html(as_images=True)
    encoded = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', image)[1]
    assert "(log scale)" in base64.b64decode(encoded).decode()
    assert 'alt="loss: last 0.0001 at step 999"' in image


def test_rich_displays_a_rank_could_not_show_are_counted_and_said():
    from notebook_accel.wire import RichHidden

    record = make_record()
    for _ in range(3):
        record.apply(1, RichHidden(1))
    said = "rank 1 displayed 3 rich outputs (shown for rank 0, in a notebook)"
    assert said in render(record)["text/plain"] and said in render(record)["text/html"]
    record.finish("finished")
    assert said in TextView(record).summary_line(record)


def test_only_a_default_repr_counts_as_no_useful_text():
    from notebook_accel.launch.worker.display import _DEFAULT_REPR

    assert _DEFAULT_REPR.fullmatch("<IPython.core.display.HTML object>")
    assert _DEFAULT_REPR.fullmatch("<foo.Bar object at 0x7f00aa>")
    assert not _DEFAULT_REPR.fullmatch("IntSlider(value=3)")
    assert not _DEFAULT_REPR.fullmatch("<b>an html object</b>")


def _chart_labels(svg: str) -> list[str]:
    return re.findall(r'text-anchor="end" font-size="9" fill="#555">([^<]+)<', svg)[:2]


def test_a_constant_metric_gets_a_range_around_its_value_with_distinct_labels():
    plots = Plots()
    plots.update({"lr": [(step, 0.01) for step in range(50)], "zero": [(step, 0.0) for step in range(5)],
                  "near": [(0, 1.0001), (1, 1.0002)], "once": [(3, 2.0)]})
    svgs = {name: metric_svg(name, series) for name, series in plots.series.items()}
    assert _chart_labels(svgs["lr"]) == ["0.011", "0.009"]  # top, bottom
    assert _chart_labels(svgs["zero"]) == ["1", "-1"]
    assert _chart_labels(svgs["near"]) == ["1.0002", "1.0001"]  # more digits, not "1" twice
    assert _chart_labels(svgs["once"]) == ["2.2", "1.8"]
    # the constant line runs across the middle of the box (y from 18 to 140 - 20)
    raw = re.search(r'points="([^"]+)"', svgs["lr"])[1].split()
    assert {point.split(",")[1] for point in raw} == {f"{(18 + 120) / 2:.1f}"}


def test_raw_and_smoothed_lines_have_a_legend_only_when_both_are_drawn():
    plots = Plots()
    plots.update({"loss": [(step, 1.0 / (step + 1)) for step in range(30)], "one": [(0, 1.0)]})
    svg = metric_svg("loss", plots.series["loss"])
    legend = re.search(r'<g class="legend">(.*?)</g>', svg)[1]
    assert re.findall(r">([a-z]+)</text>", legend) == ["raw", "smoothed"]
    # each key is drawn as its line is: the raw one light, the smoothed one solid
    assert 'stroke-opacity="0.3"' in legend.split("raw")[0]
    assert 'stroke-width="1.6"' in legend.split("raw")[1]
    assert "legend" not in metric_svg("one", plots.series["one"])


def test_live_and_final_charts_draw_with_the_same_font():
    import base64

    from magics.view.plots import FONT

    record = make_record(age=2.0)
    record.history["loss"] = [(step, 1.0 / (step + 1)) for step in range(20)]
    live = render(record)["text/html"]
    record.finish("finished")
    final = render(record, final=True)["text/html"]
    inline = re.search(r"<svg .*?</svg>", live)[0]
    image = base64.b64decode(re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', final)[1]).decode()
    for svg in (inline, image):  # an image inherits no font from the page: the SVG names it
        assert re.match(r"<svg [^>]*font-family=\"([^\"]+)\"", svg)[1] == FONT
        assert svg.count("font-family") == 1  # no text overrides it
