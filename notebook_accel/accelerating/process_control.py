"""The ``Accelerator``'s collectives and process control: gathering and reducing across
processes, barriers, which process runs what, and a flag any process can raise (the mechanics:
``runtime.ops`` and ``runtime.state.PartialState``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from notebook_accel.data.uneven import even_batches_for
from notebook_accel.runtime import ops


class ProcessControl:
    """Collectives (``gather``, ``reduce``...), barriers and per-process decorators over
    ``self.state``; ``set_trigger`` / ``check_trigger`` over ``self.flag_tensor``."""

    state: Any
    strategy: Any
    gradient_state: Any
    device: torch.device
    num_processes: int
    flag_tensor: torch.Tensor | None
    _dataloaders: list[Any]

    def gather(self, tensor: Any) -> Any:
        """Concatenate tensors (nested) from all processes along dim 0."""
        return ops.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``gather``, dropping the duplicates that ``even_batches`` added to the last batch."""
        ending = self.gradient_state.end_of_dataloader
        return ops.gather_for_metrics(input_data, use_gather_object, self.gradient_state.remainder if ending else 0)

    def gather_object(self, obj: Any) -> list[Any]:
        """Gather picklable objects from all processes (lists are flattened)."""
        return ops.gather_object(obj)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce tensors (nested): ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"none"``."""
        return ops.reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: Any = 0, pad_first: bool = False) -> Any:
        """Pad tensors (nested) to the largest size along ``dim`` on any process."""
        return ops.pad_across_processes(tensor, dim, pad_index, pad_first)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        """Overwrite tensors (nested) with those of ``from_process``."""
        return ops.broadcast(tensor, from_process)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        self.state.print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """Barrier across all processes."""
        self.state.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.local_main_process_first()

    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> contextlib.AbstractContextManager[Any]:
        return self.state.split_between_processes(inputs, apply_padding)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.on_local_main_process(function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.on_process(function, process_index=self.num_processes - 1)

    def on_process(self, function: Callable[..., Any] | None = None, *, process_index: int) -> Any:
        return self.state.on_process(function, process_index=process_index)

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Let DDP models train on loaders of different lengths (``torch.distributed.algorithms.Join``).

        ``even_batches`` (when given) overrides the setting of the loaders prepared so far,
        for the duration of the block.
        """
        with even_batches_for(self._dataloaders, even_batches), self.strategy.join_uneven_inputs(joinables):
            yield

    def set_trigger(self) -> None:
        """Raise a flag on this process that ``check_trigger`` sees on every process."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """Whether any process called ``set_trigger`` since the last check (resets it)."""
        flag = self.flag_tensor if self.flag_tensor is not None else torch.tensor(0, device=self.device)
        fired = bool(ops.reduce(flag, "sum").item() >= 1)
        self.flag_tensor = None
        return fired
