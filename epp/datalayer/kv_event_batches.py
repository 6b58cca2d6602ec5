"""vLLM KV-cache event batches: the wire decoding and their folding into the index. Pure.

Wire format (vLLM ``vllm/distributed/kv_events.py``): PUB multipart ``(topic, seq 8-byte
big-endian, payload)``; ``payload`` is a msgpack ``EventBatch`` (``ts``, ``events``,
``data_parallel_rank``). vLLM has shipped three encodings, all accepted here: everything
positional (msgspec ``array_like``, tag first; until mid-2026), positional batch with
map-encoded events tagged by ``"type"`` (vllm#42892), and the batch itself as a map. Missing
trailing/optional fields read as None; unknown fields and unknown event types are ignored.
The subscriber that reads them off the socket is epp/datalayer/kv_events.py.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import msgpack

from epp.datalayer.kv_index import KVIndex

MEDIUM_GPU = "GPU"
MEDIUM_HOST = "CPU"  # host memory (vLLM's CPU offload; SGLang's HiCache host tier)

_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class KVEventError(ValueError):
    """A payload that is not a vLLM KV event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[Hashable]
    parent_block_hash: Hashable | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None = None
    medium: str | None = None
    group_idx: int | None = None
    lora_id: int | None = None  # the pod's lora_int_id (older vLLM sends only this)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[Hashable]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


def _fields(raw: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """Named fields of one event, from either encoding (positional: after the tag)."""
    if isinstance(raw, dict):
        return raw
    return dict(zip(names, raw[1:], strict=False))


def _hash(value: Any) -> Hashable:
    if isinstance(value, int | bytes) and not isinstance(value, bool):
        return value
    raise KVEventError(f"block hash must be an int or bytes, not {type(value).__name__}")


def _int_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise KVEventError(f"{what} must be a list")
    return value


def decode_event(raw: Any) -> Event | None:
    """One event; None for an event type this index does not use."""
    if isinstance(raw, dict):
        tag = raw.get("type")
    elif isinstance(raw, list) and raw:
        tag = raw[0]
    else:
        raise KVEventError("event must be a tagged map or array")
    if tag == "BlockStored":
        f = _fields(raw, _STORED_FIELDS)
        hashes = [_hash(h) for h in _int_list(f.get("block_hashes"), "block_hashes")]
        parent = f.get("parent_block_hash")
        tokens = _int_list(f.get("token_ids"), "token_ids")
        size = f.get("block_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise KVEventError("block_size must be a positive integer")
        if len(tokens) < size * len(hashes):
            raise KVEventError("token_ids shorter than block_hashes x block_size")
        try:
            array("Q", tokens)  # C-speed check: unsigned 64-bit integers, like block_keys packs them
        except (OverflowError, TypeError):
            raise KVEventError("token_ids must be non-negative 64-bit integers") from None
        lora = f.get("lora_name")
        lora_id = f.get("lora_id")
        return BlockStored(
            hashes,
            None if parent is None else _hash(parent),
            tokens,
            size,
            lora if isinstance(lora, str) and lora else None,
            f.get("medium"),
            f.get("group_idx"),
            lora_id if isinstance(lora_id, int) and not isinstance(lora_id, bool) and lora_id > 0 else None,
        )
    if tag == "BlockRemoved":
        f = _fields(raw, _REMOVED_FIELDS)
        hashes = [_hash(h) for h in _int_list(f.get("block_hashes"), "block_hashes")]
        return BlockRemoved(hashes, f.get("medium"), f.get("group_idx"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if isinstance(tag, str):
        return None  # a newer event kind: ignored, like an unknown field
    raise KVEventError("event tag must be a string")


def decode_batch(payload: bytes) -> EventBatch:
    """A payload in any of vLLM's three encodings; `KVEventError` when it is none of them."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise KVEventError(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise KVEventError("batch must be [ts, events, ...] or a map")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not isinstance(events, list):
        raise KVEventError("batch needs a numeric ts and a list of events")
    decoded = [e for e in (decode_event(x) for x in events) if e is not None]
    return EventBatch(float(ts), decoded, rank if isinstance(rank, int) else None)


def tier_of(medium: str | None) -> bool | None:
    """The index tier of an event's medium: False for GPU memory (or none named), True for host
    memory (vLLM's CPU offload names it "CPU"), None for a tier not modelled (disk, remote)."""
    if medium is None or medium == MEDIUM_GPU:
        return False
    return True if medium.upper() == MEDIUM_HOST else None


def apply_batch(index: KVIndex, pod: str, batch: EventBatch) -> int:
    """Fold one batch into the index: the first KV-cache group's events of the GPU and host
    tiers (kv_index.py). Returns events used."""
    used = 0
    for ev in batch.events:
        if isinstance(ev, BlockStored | BlockRemoved):
            host = tier_of(ev.medium)
            if host is None or ev.group_idx not in (None, 0):
                continue
            if isinstance(ev, BlockStored):
                index.apply_stored(
                    pod,
                    ev.block_hashes,
                    ev.parent_block_hash,
                    ev.token_ids,
                    ev.block_size,
                    ev.lora_name,
                    host,
                )
            else:
                index.apply_removed(pod, ev.block_hashes, host)
        else:
            index.clear_pod(pod)
        used += 1
    return used


def stored_adapters(batch: EventBatch) -> list[tuple[str | None, int | None]]:
    """The adapters (lora_name, lora_id) whose GPU blocks a batch stored, each once: the
    engine ran them in that step (epp/datalayer/adapter_residency.py, adapter residency)."""
    seen: dict[tuple[str | None, int | None], None] = {}
    for ev in batch.events:
        if isinstance(ev, BlockStored) and ev.medium in (None, MEDIUM_GPU):
            if ev.lora_name is not None or ev.lora_id is not None:
                seen[(ev.lora_name, ev.lora_id)] = None
    return list(seen)
