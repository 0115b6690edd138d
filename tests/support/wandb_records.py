"""Read the records of a wandb offline run file (`run-ID.wandb`) back, for tests.

wandb 0.31 ships no Python reader for its run files. The file is a 7-byte header (`:W&B`, magic 0xBEE1, version 0)
followed by LevelDB's log format (32 KiB blocks; each chunk: crc32 u32, length u16, type u8 with 1 full, 2 first,
3 middle, 4 last); each assembled record is a serialized `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")


def read_records(path: str | Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = HEADER.unpack_from(data)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    records, pending, pos = [], b"", HEADER.size
    while pos + CHUNK.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK.size:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = CHUNK.unpack_from(data, pos)
        pos += CHUNK.size
        if kind == 0 and length == 0:
            break
        pending += data[pos : pos + length]
        pos += length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def history(path: str | Path) -> list[dict[str, Any]]:
    """The rows passed to `run.log`, with `_step`, in order."""
    rows = []
    for record in read_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows


def config(path: str | Path) -> dict[str, Any]:
    """The run config, merged over its config records."""
    out: dict[str, Any] = {}
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        updates = record.config.update if kind == "config" else record.run.config.update if kind == "run" else []
        out.update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in updates})
    return out
