"""The live view's one progress bar for the job (rate and ETA), as HTML and plain text."""

from __future__ import annotations

from html import escape

from notebook_accel.launch import LaunchRecord, node_table, per_node, progress_line
from notebook_accel.observe.progress import bar_label, job_progress

_COLOURS = {"finished": "#2ca02c", "failed": "#d62728", "interrupted": "#ff7f0e",
            "timed out": "#d62728"}


_last: list = [None, ("", "")]  # what the last call drew: (its rank's state, ...), its parts


def progress_parts(record: LaunchRecord) -> tuple[str, str]:
    """The job's progress as ``(text/plain, text/html)``: tqdm's one line, and a bar (percent
    done, or a moving count without a total) with that line's figures; empty without progress
    events. Made again only when the bar shown changed (a redraw without news of it reuses
    the last parts: a rank's state is replaced, never changed, by its next event)."""
    state = job_progress(record, node_table(record).slowest() if per_node(record) else None)
    if state is None:
        return "", ""
    key = (record.progress[state["rank"]], state["rank"], record.outcome, len(record.progress) > 1)
    if _last[0] is not None and _last[0][0] is key[0] and _last[0][1:] == key[1:]:
        return _last[1]
    line = progress_line(state)
    _last[:] = key, (line, _progress_html(record, state, line))
    return _last[1]


def _progress_html(record: LaunchRecord, state: dict, line: str) -> str:
    """The bar, then tqdm's figures: ``line`` after its label (``"train: "``)."""
    total, n, label = state.get("total"), state.get("n", 0), bar_label(state)
    figures = line[len(label) + 2:] if label and line.startswith(f"{label}: ") else line
    fraction = min(max(n / total, 0.0), 1.0) if total else 0.0
    colour = _COLOURS.get(record.outcome or "", "#1f77b4")
    who = f" (rank {state['rank']})" if len(record.progress) > 1 else ""
    desc = escape(label or "progress") + who
    bar = (f'<div style="display:inline-block;width:300px;height:12px;border:1px solid #999;'
           f'vertical-align:middle;background:#eee"><div style="width:{fraction * 100:.1f}%;'
           f'height:100%;background:{colour}"></div></div>') if total else ""
    return (f'<div style="margin:4px 0;font-size:12px"><span>{desc}:</span> {bar}'
            f"<span> {escape(figures.strip())}</span></div>")
