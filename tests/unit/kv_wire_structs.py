"""msgspec struct definitions of vLLM's KV-event wire format, for independent fixtures.

Written from reading ``vllm/distributed/kv_events.py`` (not imported from vLLM): same field
order, defaults, tagging (``tag=True``: the class name, under ``"type"`` in map form, first
in array form) and ``omit_defaults``. Three generations of the encoding:

- ``legacy``: EventBatch and events ``array_like`` (vLLM until vllm#42892);
- ``v026``: positional EventBatch, map-encoded events (vllm#42892, e.g. vLLM 0.26);
- ``current``: EventBatch and events both maps (the newest source read).

Only the test-suite imports this; msgspec is a dev dependency.
"""

from __future__ import annotations

from typing import Any

import msgspec


def _family(batch_array: bool, event_array: bool) -> dict[str, Any]:
    class EventBatch(msgspec.Struct, array_like=batch_array, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=event_array, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[tuple[Any, ...] | None] | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int | bytes]
        medium: str | None
        group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return {
        "EventBatch": EventBatch,
        "BlockStored": BlockStored,
        "BlockRemoved": BlockRemoved,
        "AllBlocksCleared": AllBlocksCleared,
    }


FAMILIES = {
    "legacy": _family(batch_array=True, event_array=True),
    "v026": _family(batch_array=True, event_array=False),
    "current": _family(batch_array=False, event_array=False),
}

_encoder = msgspec.msgpack.Encoder()


def encode(family: str, ts: float, events: list[Any], rank: int | None = 0) -> bytes:
    return _encoder.encode(FAMILIES[family]["EventBatch"](ts=ts, events=events, data_parallel_rank=rank))


def stored(
    family: str,
    hashes: list[int],
    parent: int | None,
    tokens: list[int],
    block_size: int,
    lora_name: str | None = None,
    medium: str | None = "GPU",
    group_idx: int | None = None,
    lora_id: int | None = None,
) -> Any:
    return FAMILIES[family]["BlockStored"](
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=block_size,
        lora_id=lora_id,
        medium=medium,
        lora_name=lora_name,
        extra_keys=[(lora_name,) if lora_name else None for _ in hashes],
        group_idx=group_idx,
    )


def removed(family: str, hashes: list[int], medium: str | None = "GPU") -> Any:
    return FAMILIES[family]["BlockRemoved"](block_hashes=hashes, medium=medium)


def cleared(family: str) -> Any:
    return FAMILIES[family]["AllBlocksCleared"]()


def decode_current(payload: bytes) -> Any:
    """Decode with the current structs (typed): checks modelsim's own encoder."""
    f = FAMILIES["current"]
    event_type = f["BlockStored"] | f["BlockRemoved"] | f["AllBlocksCleared"]
    batch_type = msgspec.defstruct(
        "KVEventBatch",
        [("events", list[event_type])],
        bases=(f["EventBatch"],),
        omit_defaults=True,
    )
    return msgspec.msgpack.decode(payload, type=batch_type)
