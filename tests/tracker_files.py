"""Read what wandb (offline) and mlflow (local file store) wrote, from their own run files."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_BLOCK, _HEADER = 32768, 7  # wandb's run file: leveldb-log blocks after a 7-byte file header


def wandb_records(run_file: Path) -> list[tuple[str, Any]]:
    """``(kind, record)`` for every record of a ``.wandb`` run file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunk, out = run_file.read_bytes(), _HEADER, b"", []
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        chunk += data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            out.append((record.WhichOneof("record_type"), record))
    return out


def wandb_history(run_file: Path) -> list[dict[str, Any]]:
    """Each logged row (``_step`` kept, wandb's own timing keys dropped)."""
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
             for item in record.history.item if item.key not in ("_timestamp", "_runtime")}
            for kind, record in wandb_records(run_file) if kind == "history"]


def wandb_config(run_file: Path) -> dict[str, Any]:
    return {item.key: json.loads(item.value_json) for kind, record in wandb_records(run_file)
            if kind == "config" for item in record.config.update if not item.key.startswith("_")}


def mlflow_metric(run_dir: Path, name: str) -> list[tuple[int, float]]:
    """``(step, value)`` of one metric, from the file store's ``metrics/<name>`` lines."""
    rows = [line.split() for line in (run_dir / "metrics" / name).read_text().splitlines()]
    return [(int(step), float(value)) for _, value, step in rows]
