"""``notebook_launcher(rdzv_backend="c10d")``, as the peer's test_notebook.py calls it: a real 2-process
job (the rendezvous arguments themselves: tests/unit/test_peer_names.py)."""

from __future__ import annotations


def test_a_c10d_launch_runs_on_two_processes():
    from notebook_accel import notebook_launcher

    def rank():
        from notebook_accel import PartialState

        state = PartialState()
        state.wait_for_everyone()
        return state.process_index

    assert notebook_launcher(rank, num_processes=2, rdzv_backend="c10d", max_restarts=1, monitor_interval=0.5,
                             return_all=True, start_method="fork") == [0, 1]
