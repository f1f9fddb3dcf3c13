"""Start, feed, watch and stop the workers (kernel side), and the worker entry point.

The names below are this package's public surface, for the notebook front end
(``magics``) and other callers outside the engine; the modules behind them are
internal and may move. They are imported lazily, so that importing
``notebook_accel.launch.worker`` (in every worker) stays cheap.
"""

from __future__ import annotations

from notebook_accel._lazy import lazy_exports

_EXPORTS = {
    "notebook_launcher": "notebook_accel.launch.launcher",
    "launch_request": "notebook_accel.launch.launcher",
    "WorkerPool": "notebook_accel.launch.pools.pool",
    "LaunchRequest": "notebook_accel.launch.planning.request",
    "launch_options": "notebook_accel.launch.planning.request",
    "PoolUnavailable": "notebook_accel.launch.pools.pool",
    "PoolBusy": "notebook_accel.launch.pools.background",
    "RunHandle": "notebook_accel.launch.pools.run_handle",
    "start_detached": "notebook_accel.launch.detached.client",
    "detached_pools": "notebook_accel.launch.detached.client",
    "stop_detached": "notebook_accel.launch.detached.client",
    "DetachedPool": "notebook_accel.launch.detached.attached",
    "known_cluster": "notebook_accel.launch.detached.attached",
    "cluster_pools": "notebook_accel.launch.detached.ray_client",
    "stop_on_cluster": "notebook_accel.launch.detached.ray_client",
    "WorkerError": "notebook_accel.launch.supervision.errors",
    "LaunchRecord": "notebook_accel.launch.views.record",
    "last_launch": "notebook_accel.launch.views.record",
    "View": "notebook_accel.launch.views",
    "ViewFactory": "notebook_accel.launch.views",
    "register_kernel_view": "notebook_accel.launch.views",
    "format_bytes": "notebook_accel.launch.views.text",
    "format_duration": "notebook_accel.launch.views.text",
    "format_value": "notebook_accel.launch.views.text",
    "progress_text": "notebook_accel.launch.views.text",
    "progress_line": "notebook_accel.launch.views.text",
    "rank_states": "notebook_accel.launch.views.text",
    "state_text": "notebook_accel.launch.views.text",
    "workers_text": "notebook_accel.launch.views.text",
    "ranks_text": "notebook_accel.launch.views.rank_ranges",
    "parse_ranks": "notebook_accel.launch.views.rank_ranges",
    "RankStatus": "notebook_accel.launch.views.record",
    "RankState": "notebook_accel.launch.views.record",
    "NodeRow": "notebook_accel.launch.views.nodes",
    "node_rows": "notebook_accel.launch.views.nodes",
    "abnormal_ranks": "notebook_accel.launch.views.nodes",
    "per_node": "notebook_accel.launch.views.nodes",
    "node_table": "notebook_accel.launch.views.nodes",
    "prepare_node_table": "notebook_accel.launch.views.nodes",
    "rich_hidden_text": "notebook_accel.launch.views.text",
    "serialise_payload": "notebook_accel.launch.handoff.payload",
    "dumps_result": "notebook_accel.launch.handoff.payload",
    "check_sendable": "notebook_accel.launch.handoff.payload",
    "cell_numbers": "notebook_accel.launch.handoff.cells",
    "rank_bound_kind": "notebook_accel.launch.handoff.rank_identity",
    "join_process_group": "notebook_accel.launch.worker.serve",
    "launch_in_force": "notebook_accel.launch.planning.in_force",
    "fork_unsafe_reason": "notebook_accel.launch.planning.start_method",
    "deferred_interrupts": "notebook_accel.launch.control.interrupts",
    "LaunchInterrupted": "notebook_accel.launch.control.interrupts",
    "worker_scope": "notebook_accel.launch.worker.namespace",
    "start_local_cluster": "notebook_accel.launch.cluster.local_cluster",
    "where_workers_run": "notebook_accel.launch.backends",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
