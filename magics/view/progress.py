"""The live view's one progress bar for the job (rate and ETA), as HTML and plain text."""

from __future__ import annotations

from html import escape

from tqdm.std import tqdm as _tqdm

from notebook_accel.launch import LaunchRecord, node_table, per_node, progress_text
from notebook_accel.observe.progress import bar_label, job_progress

_DETAIL = "{n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_COLOURS = {"finished": "#2ca02c", "failed": "#d62728", "interrupted": "#ff7f0e",
            "timed out": "#d62728"}


def progress_html(record: LaunchRecord) -> str:
    """A bar (percent done, or a moving count without a total) with tqdm's own figures."""
    state = job_progress(record, node_table(record).slowest() if per_node(record) else None)
    if state is None:
        return ""
    total, n = state.get("total"), state.get("n", 0)
    detail = _tqdm.format_meter(
        n=n, total=total, elapsed=state.get("elapsed") or 0.0, unit=state.get("unit", "it"),
        unit_scale=state.get("unit_scale", False), rate=state.get("rate"),
        postfix=state.get("postfix") or None, **({"bar_format": _DETAIL} if total else {"ncols": 0}),
    )
    fraction = min(max(n / total, 0.0), 1.0) if total else 0.0
    colour = _COLOURS.get(record.outcome or "", "#1f77b4")
    who = f" (rank {state['rank']})" if len(record.progress) > 1 else ""
    desc = escape(bar_label(state) or "progress") + who
    bar = (f'<div style="display:inline-block;width:300px;height:12px;border:1px solid #999;'
           f'vertical-align:middle;background:#eee"><div style="width:{fraction * 100:.1f}%;'
           f'height:100%;background:{colour}"></div></div>') if total else ""
    percent = f" {fraction * 100:3.0f}%" if total else ""
    return (f'<div style="margin:4px 0;font-size:12px"><span>{desc}:</span> {bar}'
            f"<span>{percent} {escape(detail.strip())}</span></div>")


def progress_plain(record: LaunchRecord) -> str:
    """The same as one tqdm-style line (empty without progress events)."""
    return progress_text(record) or ""
