"""What a snapshot must match to be resumed: the world size (unless the strategy reshards its state:
FSDP's, through ``torch.distributed.checkpoint``), the strategy, the prepared objects' counts and
every model's weight shapes. A snapshot records them (``snapshot.json``); ``resume``
refuses one that differs, naming the difference, rather than load a state that is not this run's.
"""

from __future__ import annotations

from typing import Any

from notebook_accel.runtime.helpers import extract_model_from_parallel


def identity(accelerator: Any) -> dict[str, Any]:
    """This run's side of the comparison (plain types: it goes into ``snapshot.json``)."""
    return {
        "world_size": accelerator.num_processes,
        "reshards": bool(accelerator.strategy.checkpointer([], []).reshards),
        "strategy": type(accelerator.strategy).__name__,
        "distributed_type": str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type)),
        "models": [_shapes(m) for m in accelerator._models],
        "optimizers": len(accelerator._optimizers),
        "schedulers": len(accelerator._schedulers),
        "dataloaders": len(accelerator._dataloaders),
        "custom_objects": len(accelerator._custom_objects),
    }


def differences(saved: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """How the snapshot's identity ``saved`` differs from this run's ``here``, in words (``[]``: none)."""
    found = []
    if saved.get("world_size") != here["world_size"] and not (saved.get("reshards") and here["reshards"]):
        found.append(f"it was taken with {saved.get('world_size')} processes, this run has {here['world_size']}")
    if saved.get("strategy") != here["strategy"]:
        found.append(f"it was taken with the {saved.get('strategy')} strategy, this run uses {here['strategy']}")
    for kind in ("optimizers", "schedulers", "dataloaders", "custom_objects"):
        if saved.get(kind, here[kind]) != here[kind]:
            found.append(f"it holds {saved[kind]} {kind}, this run prepared {here[kind]}")
    saved_models = saved.get("models", [])
    if len(saved_models) != len(here["models"]):
        found.append(f"it holds {len(saved_models)} models, this run prepared {len(here['models'])}")
    for index, (old, new) in enumerate(zip(saved_models, here["models"], strict=False)):
        found += _shape_differences(index, old, new)
    return found


def _shapes(model: Any) -> dict[str, list[int]]:
    """The weights' full shapes (a sharded model's DTensors say theirs: nothing is gathered)."""
    module = extract_model_from_parallel(model, keep_torch_compile=False)
    return {name: list(tensor.shape) for name, tensor in module.state_dict().items()}


def _shape_differences(index: int, old: dict[str, list[int]], new: dict[str, list[int]], most: int = 3) -> list[str]:
    lines = [f"model {index}'s {name} is {old[name]} in it, {new[name]} here"
             for name in old if name in new and old[name] != new[name]]
    missing = [name for name in new if name not in old]
    extra = [name for name in old if name not in new]
    if missing:
        lines.append(f"model {index} has weights it lacks: {', '.join(missing[:most])}"
                     + (f" (and {len(missing) - most} more)" if len(missing) > most else ""))
    if extra:
        lines.append(f"it has weights model {index} lacks: {', '.join(extra[:most])}"
                     + (f" (and {len(extra) - most} more)" if len(extra) > most else ""))
    return lines[: most + 2]
