"""Disaggregated prefill/decode as vLLM's NIXL connector exposes it over the OpenAI API.

A prefill request carries ``kv_transfer_params: {"do_remote_decode": true, ...}`` (the routing
sidecar also sets ``max_tokens: 1``): the pod computes the prompt's KV, keeps the blocks and
answers with ``kv_transfer_params`` naming them (``remote_block_ids``, ``remote_engine_id``,
``remote_host``, ``remote_port``, ``remote_request_id``). The decode request carries those params
back (``do_remote_prefill: true``): the decode pod reads the blocks from the prefiller, which
takes ``tokens x kv_bytes_per_token / kv_link_gbytes_s + kv_transfer_latency_ms`` of the
prefiller's profile, then decodes. In the simulator the read is one HTTP call to the
prefiller's ``POST /sim/kv-transfer`` (``remote_port`` is the pod's HTTP port, not NIXL's side
channel); a failed read is recomputed locally, as vLLM's ``recompute`` load-failure policy does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelsim.openai_api import ApiError

ROLES = ("prefill", "decode", "both")
# vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT default: a prefiller frees KV nobody read after this.
HOLD_TIMEOUT_S = 480.0


@dataclass(frozen=True, slots=True)
class TransferParams:
    """The parts of ``kv_transfer_params`` the simulator acts on."""

    do_remote_decode: bool = False  # prefill here, hold the KV for a decode pod
    do_remote_prefill: bool = False  # the KV is on the prefiller named below
    remote_host: str | None = None
    remote_port: int | None = None
    remote_request_id: str | None = None


def parse_transfer_params(body: dict[str, Any]) -> TransferParams | None:
    """``kv_transfer_params`` of a generation body, validated; None when absent or null."""
    raw = body.get("kv_transfer_params")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ApiError(400, "'kv_transfer_params' must be an object")
    flags = {}
    for key in ("do_remote_decode", "do_remote_prefill"):
        v = raw.get(key, False)
        if not isinstance(v, bool):
            raise ApiError(400, f"'kv_transfer_params.{key}' must be a boolean")
        flags[key] = v
    if flags["do_remote_decode"] and flags["do_remote_prefill"]:
        raise ApiError(400, "'kv_transfer_params' cannot ask for both remote prefill and remote decode")
    if not flags["do_remote_prefill"]:
        return TransferParams(do_remote_decode=flags["do_remote_decode"])
    host, port, rid = raw.get("remote_host"), raw.get("remote_port"), raw.get("remote_request_id")
    if not isinstance(host, str) or not host:
        raise ApiError(400, "'kv_transfer_params.remote_host' must be a non-empty string")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ApiError(400, "'kv_transfer_params.remote_port' must be a port number")
    if not isinstance(rid, str) or not rid:
        raise ApiError(400, "'kv_transfer_params.remote_request_id' must be a non-empty string")
    return TransferParams(False, True, host, port, rid)


def prefill_answer(
    engine_id: str, host: str, port: int, request_id: int, block_ids: list[int]
) -> dict[str, Any]:
    """The ``kv_transfer_params`` a prefill-only response carries to the decode request."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine_id,
        "remote_block_ids": block_ids,
        "remote_host": host,
        "remote_port": port,
        "remote_request_id": str(request_id),
        "tp_size": 1,
    }
