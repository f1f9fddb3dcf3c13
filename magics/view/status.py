"""The live view's header and per-rank table, as HTML and as plain text."""

from __future__ import annotations

from html import escape

from notebook_accel.launch import (
    LaunchRecord,
    RankStatus,
    format_bytes,
    format_duration,
    rank_states,
    state_text,
    workers_text,
)

STATE_COLOURS = {
    "starting": "#888888",
    "running": "#1f77b4",
    "compiling": "#9467bd",
    "finished": "#2ca02c",
    "failed": "#d62728",
    "stopped": "#ff7f0e",
}
LAST_LINE_CHARS = 120


def _short(text: str, limit: int = LAST_LINE_CHARS) -> str:
    text = text.rstrip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def header_text(record: LaunchRecord) -> str:
    """``2 processes on cpu · fresh workers (fork) · mixed precision: no · running 3.2 s``
    (``on the warm pool (fork)`` for a pool's run; ``(world size 4)`` after the processes
    when other nodes run more)."""
    if record.outcome is None:
        status = f"running {format_duration(record.elapsed)}"
    else:
        word = "in" if record.outcome == "finished" else "after"
        status = f"{record.outcome} {word} {format_duration(record.elapsed)}"
    world = (f" (world size {record.world_size})"
             if record.world_size != record.num_processes else "")
    return (f"{record.num_processes} processes{world} on {record.device_type} · "
            f"{workers_text(record)} · mixed precision: {record.mixed_precision} · {status}")


def _shows_gpu(record: LaunchRecord) -> bool:
    return any(status.gpu_memory is not None for status in record.ranks.values())


def _state_label(status: RankStatus, root_cause: bool = False) -> str:
    state, exitcode = status.state, status.exitcode
    label = state_text(status)
    if state in ("failed", "stopped") and exitcode is not None:
        label = f"{state} (exit {exitcode})"
    return f"{label} · root cause" if root_cause else label


def _colour(record: LaunchRecord, rank: int, state: str) -> str:
    """Red for the root cause only: ranks that failed because of it look like stopped ones."""
    if state == "failed" and record.root_cause is not None and rank != record.root_cause:
        return STATE_COLOURS["stopped"]
    return STATE_COLOURS.get(state, "#000000")


def status_text(record: LaunchRecord) -> str:
    """The header and one line per rank, for ``text/plain``."""
    lines = [f"notebook_accel: {header_text(record)} · {rank_states(record)}"]
    gpu = _shows_gpu(record)
    for rank, status in sorted(record.ranks.items()):
        memory = f"RSS {format_bytes(status.rss)}"
        if gpu:
            memory += f", GPU {format_bytes(status.gpu_memory)}"
        label = _state_label(status, rank == record.root_cause)
        line = (f"  rank {rank}: {label}, "
                f"pid {status.pid}, {format_duration(status.elapsed)}, {memory}")
        if status.last_line.strip():
            line += f" | {_short(status.last_line)}"
        lines.append(line)
    return "\n".join(lines)


def status_html(record: LaunchRecord) -> str:
    """The header and a table of ranks (everything from workers is escaped)."""
    gpu = _shows_gpu(record)
    heads = ["rank", "state", "pid", "elapsed", "RSS"] + (["GPU"] if gpu else []) + ["last output"]
    cell = 'style="padding:1px 8px;text-align:left;border:none"'
    rows = ["<tr>" + "".join(f"<th {cell}>{h}</th>" for h in heads) + "</tr>"]
    for rank, status in sorted(record.ranks.items()):
        colour = _colour(record, rank, status.state)
        label = _state_label(status, rank == record.root_cause)
        values = [
            str(rank),
            f'<span style="color:{colour};font-weight:bold">{escape(label)}</span>',
            str(status.pid or "-"),
            format_duration(status.elapsed),
            format_bytes(status.rss),
        ]
        if gpu:
            values.append(format_bytes(status.gpu_memory))
        last = _short(status.last_line)
        values.append(f"<code>{escape(last)}</code>" if last.strip() else "")  # no empty box
        rows.append("<tr>" + "".join(f"<td {cell}>{v}</td>" for v in values) + "</tr>")
    return (f'<div style="margin-bottom:4px"><b>notebook_accel</b> · {escape(header_text(record))}'
            f'</div><table style="border-collapse:collapse;font-size:12px;margin:0">'
            + "".join(rows) + "</table>")
