"""wandb (offline) and mlflow (local file store) behind ``log_with``, on 2 processes: the
values in their run files are what was logged, only the main process writes, and
``end_training`` closes the run."""

from __future__ import annotations

import pytest

from notebook_accel import notebook_launcher
from tests.tracker_files import mlflow_metric, wandb_config, wandb_history

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


def _train(names: list[str], init_kwargs: dict) -> dict:
    import numpy as np
    import torch

    from notebook_accel import Accelerator

    accelerator = Accelerator(log_with=names)
    accelerator.init_trackers("proj", config={"lr": 0.1, "name": "tiny"}, init_kwargs=init_kwargs)
    rank = accelerator.process_index
    for step in range(3):
        loss = 1.0 / (step + 1) + rank
        accelerator.log({"loss": torch.tensor(loss) if step == 0 else loss}, step=step)  # a tensor too
    tracker = accelerator.get_tracker(names[0])
    if "wandb" in names:
        tracker.log_table("preds", columns=["text", "score"], data=[["a", 1], ["b", 2]], step=3)
        tracker.log_images({"samples": [np.zeros((4, 4, 3), dtype=np.uint8)]}, step=4)
    run = accelerator.get_tracker(names[0], unwrap=True)
    run_id = None if run is None else getattr(getattr(run, "info", None), "run_id", None) or run.id
    accelerator.end_training()
    return {"rank": rank, "type": type(tracker).__name__, "run_id": run_id}


@pytest.fixture
def tracker_env(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the local file store, as the brief asks
    (tmp_path / "wandb-dir").mkdir()
    return tmp_path


def test_wandb_offline_run_holds_what_rank_zero_logged(tracker_env):
    results = notebook_launcher(_train, args=(["wandb"], {"wandb": {"mode": "offline"}}),
                                num_processes=2, return_all=True)
    assert [r["type"] for r in results] == ["WandBTracker", "BlankTracker"]  # rank 1: blank
    runs = list((tracker_env / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, runs  # only the main process wrote
    assert runs[0].name == f"run-{results[0]['run_id']}.wandb"
    history = wandb_history(runs[0])
    assert [(row["_step"], row["loss"]) for row in history[:3]] == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert history[3]["preds/_type"] == "table-file" and history[3]["preds/nrows"] == 2
    assert history[4]["samples/_type"] == "images/separated"
    assert wandb_config(runs[0]) == {"lr": 0.1, "name": "tiny"}
    from tests.tracker_files import wandb_records

    assert [r.exit.exit_code for kind, r in wandb_records(runs[0]) if kind == "exit"] == [0]  # closed


def test_mlflow_file_store_run_holds_what_rank_zero_logged(tracker_env):
    results = notebook_launcher(_train, args=(["mlflow"], {"mlflow": {"run_name": "first"}}),
                                num_processes=2, return_all=True)
    assert [r["type"] for r in results] == ["MLflowTracker", "BlankTracker"]
    runs = [p.parent for p in (tracker_env / "mlruns").glob("*/*/meta.yaml")]
    assert len(runs) == 1 and runs[0].name == results[0]["run_id"], runs
    assert mlflow_metric(runs[0], "loss") == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert (runs[0] / "params" / "lr").read_text() == "0.1"
    assert (runs[0] / "tags" / "mlflow.runName").read_text() == "first"
    meta = (runs[0] / "meta.yaml").read_text()
    assert "status: 3" in meta and "end_time: null" not in meta  # FINISHED: end_training closed it


def test_an_unknown_tracker_name_lists_the_known_ones():
    from notebook_accel import Accelerator

    with pytest.raises(ValueError, match="'wandb', 'mlflow'"):
        Accelerator(log_with="nope").init_trackers("p")
