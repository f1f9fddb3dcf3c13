"""The live view of a running launch in the notebook: one display block updated in place.

The block holds a header (world size, device, start method, mixed precision), a
table of ranks (state, pid, elapsed, memory, last output line), one progress bar
for the job and a chart per logged metric. It appears once the job has run for
``appear_after`` seconds (a trivial job shows nothing; until then the supervisor
holds relayed output back, so the block always sits above it), is redrawn at most every
``interval`` seconds through its display id (never ``clear_output``, so worker
output relayed into the cell stays), and ends as a static summary that stays in
the notebook. The wakeups between two redraws make a large launch's per-node summary
ready, a little at a time, so that a redraw costs about what it shows. Every display carries ``text/plain`` too, for consoles and nbconvert.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from magics.view.plots import Plots
from magics.view.progress import progress_parts
from magics.view.status import node_line, status_parts
from notebook_accel.launch import LaunchRecord, prepare_node_table, rich_hidden_text


def render(record: LaunchRecord, plots: Plots | None = None,
           final: bool = False) -> dict[str, str]:
    """The whole block as a MIME bundle (``text/html`` and ``text/plain``).

    Args:
        record: the launch.
        plots: the charts kept between redraws (a new set when None).
        final: the summary that stays in the saved notebook: charts as images, which
            survive the sanitiser of a reopened (untrusted) notebook.
    """
    plots = plots or Plots()
    plots.update(record.history)
    status_plain, status_rich = status_parts(record)
    progress_plain, progress_rich = progress_parts(record)
    plain = [status_plain, progress_plain, plots.text()]
    dropped = sum(record.dropped.values())
    notes = [f"{dropped} events dropped (the kernel lagged)" if dropped else "",
             rich_hidden_text(record) or ""]
    note = "; ".join(n for n in notes if n)
    html = ('<div class="notebook-accel-live" style="font-size:12px;line-height:1.35">'
            + status_rich + progress_rich + plots.html(as_images=final)
            + (f'<div style="color:#888">{note}</div>' if note else "") + "</div>")
    return {"text/html": html, "text/plain": "\n".join(p for p in [*plain, note] if p)}


def _ipython_display(bundle: dict[str, str]) -> Any:
    from IPython.display import display

    return display(bundle, raw=True, display_id=True)


class LiveView:
    """Draws a :class:`LaunchRecord` into the launching cell while the job runs.

    Args:
        record: the launch (the supervisor keeps it up to date and calls :meth:`update`).
        display: shows a MIME bundle and returns a handle with ``update(bundle,
            raw=True)``; default ``IPython.display.display(..., display_id=True)``.
        appear_after: seconds of running before anything is shown.
        interval: least seconds between two redraws.
        clock: monotonic clock (tests pass their own).
    """

    def __init__(
        self,
        record: LaunchRecord,
        display: Callable[[dict[str, str]], Any] | None = None,
        appear_after: float = 1.0,
        interval: float = 0.3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.display = display or _ipython_display
        self.appear_after = appear_after
        self.interval = interval
        self.clock = clock
        self.handle: Any = None
        self.last_draw = float("-inf")
        self.last_bundle: dict[str, str] | None = None
        self.draws = 0
        self.done = False
        self.plots = Plots()

    @property
    def holds_output(self) -> bool:
        """True until the block is shown (or the job ended without it): the block's place
        is under the cell's input, above the relayed output, whenever that starts."""
        return self.handle is None and not self.done

    def update(self, record: LaunchRecord, final: bool = False) -> None:
        """Redraw when due; with ``final``, draw the static summary (if shown at all)."""
        if self.done:
            return
        if final:
            self.done = True
            if self.handle is None and record.elapsed < self.appear_after:
                return  # a trivial job: nothing to show
        elif record.elapsed < self.appear_after:
            prepare_node_table(record, node_line)
            return
        now = self.clock()
        if not final and now - self.last_draw < self.interval:
            prepare_node_table(record, node_line)  # (a large launch's summary, a little each wakeup)
            return
        self.last_draw = now
        bundle = render(record, self.plots, final=final)
        if bundle == self.last_bundle:
            return
        self.last_bundle = bundle
        self.draws += 1
        if self.handle is None:
            self.handle = self.display(bundle)
        else:
            self.handle.update(bundle, raw=True)
