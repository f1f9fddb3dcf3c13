"""``log_with="mlflow"``: an MLflow run (``MLFLOW_TRACKING_URI``: a server or a local store),
as the peer's: the ``MLFLOW_*`` variables win over the arguments."""

from __future__ import annotations

import json
import os
from typing import Any

from notebook_accel._peer_paths import peer_logger
from notebook_accel.flags import str_to_bool
from notebook_accel.observe.tracking import GeneralTracker

logger = peer_logger(__name__)


class MLflowTracker(GeneralTracker):
    """One MLflow run in the experiment ``experiment_name`` (created when missing), started by
    ``start()`` (``init_trackers`` calls it), not when the tracker is built: as the peer's.

    Args:
        experiment_name: the experiment (``MLFLOW_EXPERIMENT_NAME`` wins).
        logging_dir: the experiment's artifact location, when it is created.
        run_id: resume this run (``MLFLOW_RUN_ID`` wins).
        tags: the run's tags, a dict or its JSON (``MLFLOW_TAGS`` wins).
        nested_run: nest the run in the active one (``MLFLOW_NESTED_RUN`` wins).
        run_name: the new run's name.
        description: the run's description.
    Raises:
        ImportError: when the ``mlflow`` package is missing.
    """

    name = "mlflow"

    def __init__(self, experiment_name: str | None = None, logging_dir: str | os.PathLike[str] | None = None,
                 run_id: str | None = None, tags: dict[str, Any] | str | None = None,
                 nested_run: bool = False, run_name: str | None = None,
                 description: str | None = None) -> None:
        try:
            import mlflow  # noqa: F401
        except ImportError as exc:
            raise ImportError("log_with='mlflow' needs the mlflow package: pip install mlflow") from exc
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        nested = os.environ.get("MLFLOW_NESTED_RUN")
        self.nested_run = bool(str_to_bool(nested)) if nested is not None else nested_run
        self.run_name, self.description = run_name, description
        self.active_run: Any = None

    def start(self) -> None:
        """Start (or resume) the run, creating the experiment when missing."""
        import mlflow

        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        experiment_id = found[0].experiment_id if found else mlflow.create_experiment(
            name=self.experiment_name,
            artifact_location=None if self.logging_dir is None else str(self.logging_dir), tags=self.tags)
        self.active_run = mlflow.start_run(
            run_id=self.run_id, experiment_id=experiment_id, run_name=self.run_name, nested=self.nested_run,
            tags=self.tags, description=self.description)

    @property
    def tracker(self) -> Any:
        return self.active_run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Log ``values`` as parameters (too long ones are dropped, with a warning)."""
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = [(key, value) for key, value in values.items() if len(str(value)) <= MAX_PARAM_VAL_LENGTH]
        if len(params) < len(values):
            logger.warning("MLflow keeps parameters of at most %d characters; longer ones were dropped",
                           MAX_PARAM_VAL_LENGTH)
        for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(params[start:start + MAX_PARAMS_TAGS_PER_BATCH]))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log the numeric ``values`` (and one-element tensors) as metrics; MLflow takes numbers
        only, so others are dropped, with a warning."""
        import mlflow

        values = {key: value.item() if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1
                  else value for key, value in values.items()}
        metrics = {key: value for key, value in values.items() if isinstance(value, (int, float))}
        if len(metrics) < len(values):
            logger.warning("MLflow logs numbers only; dropped %s", sorted(set(values) - set(metrics)))
        mlflow.log_metrics(metrics, step=step, **kwargs)

    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        """Save a matplotlib or plotly ``figure`` as the run's ``artifact_file``."""
        import mlflow

        mlflow.log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Copy everything in ``local_dir`` into the run's artifacts."""
        import mlflow

        mlflow.log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Copy the file ``local_path`` into the run's artifacts."""
        import mlflow

        mlflow.log_artifact(local_path=local_path, artifact_path=artifact_path)

    def finish(self) -> None:
        import mlflow

        mlflow.end_run()
