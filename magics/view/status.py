"""The live view's header and table, as HTML and as plain text: one row per rank, or above a
few dozen ranks one per node plus the abnormal ranks (``notebook_accel.launch.views.nodes``),
so that a redraw stays small whatever the scale."""

from __future__ import annotations

from html import escape

from notebook_accel.launch import (
    LaunchRecord,
    NodeRow,
    RankState,
    RankStatus,
    abnormal_ranks,
    format_bytes,
    format_duration,
    node_rows,
    node_table,
    per_node,
    rank_states,
    ranks_text,
    state_text,
    workers_text,
)

STATE_COLOURS = {
    RankState.STARTING: "#888888",
    RankState.RUNNING: "#1f77b4",
    RankState.COMPILING: "#9467bd",
    RankState.FINISHED: "#2ca02c",
    RankState.FAILED: "#d62728",
    RankState.STOPPED: "#ff7f0e",
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
    if per_node(record):  # the nodes' rows: a redraw costs the nodes, not the ranks
        return node_table(record).gpu
    return any(status.gpu_memory is not None for status in record.ranks.values())


def _state_label(status: RankStatus, root_cause: bool = False) -> str:
    state, exitcode = status.state, status.exitcode
    label = state_text(status)
    if state in (RankState.FAILED, RankState.STOPPED) and exitcode is not None:
        label = f"{state} (exit {exitcode})"
    return f"{label} · root cause" if root_cause else label


def _colour(record: LaunchRecord, rank: int, state: str) -> str:
    """Red for the root cause only: ranks that failed because of it look like stopped ones."""
    if state == RankState.FAILED and record.root_cause is not None and rank != record.root_cause:
        return STATE_COLOURS[RankState.STOPPED]
    return STATE_COLOURS.get(state, "#000000")


def node_line(row: NodeRow, gpu: bool) -> tuple[str, str]:
    """``node 0 (ranks 0-7): 8 running, slowest rank 3, RSS 1.2 GB | epoch 1 | rank 5: other``,
    and as HTML: made once per row (the wakeups between redraws make it with the row, which is
    made afresh when its node changes)."""
    text = _make_node_line(row, gpu)
    return text, escape(text)


def _node_line(row: NodeRow, gpu: bool) -> tuple[str, str]:
    line = row.shown.get(gpu)
    if line is None:
        line = row.shown[gpu] = node_line(row, gpu)
    return line


def _make_node_line(row: NodeRow, gpu: bool) -> str:
    memory = f"RSS {format_bytes(row.rss)}" + (f", GPU {format_bytes(row.gpu_memory)}" if gpu else "")
    slowest = f", slowest rank {row.slowest}" if row.slowest is not None else ""
    line = f"node {row.node} ({ranks_text(row.ranks)}): {row.states_text}{slowest}, {memory}"
    if row.common_line:
        line += f" | {_short(row.common_line, 80)}"
    if row.divergent is not None:
        rank, text = row.divergent
        more = f" (+{row.divergent_count - 1} more differ)" if row.divergent_count > 1 else ""
        line += f" | rank {rank}: {_short(text, 60) or '(no output)'}{more}"
    return line


def _rank_line(record: LaunchRecord, status: RankStatus, gpu: bool) -> str:
    memory = f"RSS {format_bytes(status.rss)}"
    if gpu:
        memory += f", GPU {format_bytes(status.gpu_memory)}"
    label = _state_label(status, status.rank == record.root_cause)
    line = (f"rank {status.rank}: {label}, "
            f"pid {status.pid}, {format_duration(status.elapsed)}, {memory}")
    if status.last_line.strip():
        line += f" | {_short(status.last_line)}"
    return line


def _node_lines(record: LaunchRecord, gpu: bool) -> tuple[list[str], list[str]]:
    """The shown nodes' lines, as text and as HTML, kept until a node's row changes."""
    drawn = node_table(record).drawn
    if gpu not in drawn:
        rows, nodes_left = node_rows(record)
        lines = [_node_line(row, gpu) for row in rows]
        if nodes_left:
            lines.append((f"... and {nodes_left} more nodes",) * 2)
        drawn[gpu] = [text for text, _ in lines], [html for _, html in lines]
    return drawn[gpu]


def _abnormal_lines(record: LaunchRecord, gpu: bool) -> list[str]:
    abnormal, ranks_left = abnormal_ranks(record)
    lines = [_rank_line(record, status, gpu) for status in abnormal]
    if ranks_left:
        lines.append(f"... and {ranks_left} more failed or stopped ranks")
    return lines


def status_parts(record: LaunchRecord) -> tuple[str, str]:
    """The header and the table as ``(text/plain, text/html)``: one row per rank, or per node
    and the abnormal ranks (everything from workers is escaped in the HTML). Both are made
    from one pass over the record: a redraw pays for its figures once."""
    header, gpu = header_text(record), _shows_gpu(record)
    if per_node(record):
        states = rank_states(record)
        nodes, nodes_html = _node_lines(record, gpu)
        abnormal = _abnormal_lines(record, gpu)
        text = "\n".join([f"notebook_accel: {header} · {states}",
                          *(f"  {line}" for line in [*nodes, *abnormal])])
        html = (f'<div style="margin-bottom:4px"><b>notebook_accel</b> · {escape(header)} · '
                f'{escape(states)}</div><pre style="font-size:12px;margin:0;white-space:pre-wrap">'
                + "\n".join([*nodes_html, *map(escape, abnormal)]) + "</pre>")
        return text, html
    statuses = sorted(record.ranks.items())
    text = "\n".join([f"notebook_accel: {header} · {rank_states(record)}",
                      *(f"  {_rank_line(record, status, gpu)}" for _, status in statuses)])
    return text, _rank_table_html(record, header, statuses, gpu)


def _rank_table_html(record: LaunchRecord, header: str, statuses: list[tuple[int, RankStatus]],
                     gpu: bool) -> str:
    heads = ["rank", "state", "pid", "elapsed", "RSS"] + (["GPU"] if gpu else []) + ["last output"]
    cell = 'style="padding:1px 8px;text-align:left;border:none"'
    rows = ["<tr>" + "".join(f"<th {cell}>{h}</th>" for h in heads) + "</tr>"]
    for rank, status in statuses:
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
    return (f'<div style="margin-bottom:4px"><b>notebook_accel</b> · {escape(header)}'
            f'</div><table style="border-collapse:collapse;font-size:12px;margin:0">'
            + "".join(rows) + "</table>")
