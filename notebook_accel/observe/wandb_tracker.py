"""``log_with="wandb"``: Weights & Biases (offline with ``WANDB_MODE=offline``), as the peer's."""

from __future__ import annotations

from typing import Any

from notebook_accel.observe.tracking import GeneralTracker


class WandBTracker(GeneralTracker):
    """One ``wandb`` run: ``wandb.init(project=run_name, **kwargs)`` (``init_kwargs["wandb"]``), made by
    ``start()`` (``init_trackers`` calls it), not when the tracker is built: as the peer's.

    Raises:
        ImportError: when the ``wandb`` package is missing.
    """

    name = "wandb"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        try:
            import wandb  # noqa: F401
        except ImportError as exc:
            raise ImportError("log_with='wandb' needs the wandb package: pip install wandb") from exc
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    def start(self) -> None:
        """Start the run."""
        import wandb

        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    def log_images(self, values: dict[str, list[Any]], step: int | None = None, **kwargs: Any) -> None:
        """Log each list of images (arrays or PIL images) under its key."""
        import wandb

        for key, images in values.items():
            self.log({key: [wandb.Image(image) for image in images]}, step=step, **kwargs)

    def log_table(self, table_name: str, columns: list[str] | None = None,
                  data: list[list[Any]] | None = None, dataframe: Any = None,
                  step: int | None = None, **kwargs: Any) -> None:
        """Log a ``wandb.Table`` made of ``columns`` and ``data``, or of a ``dataframe``."""
        import wandb

        self.log({table_name: wandb.Table(columns=columns, data=data, dataframe=dataframe)},
                 step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()
