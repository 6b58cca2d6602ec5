"""The KV transfer between disaggregated pods (modelsim/pd.py has the wire format): a decode pod
reads a prompt's KV from the prefill pod that holds it, over the prefiller's
``POST /sim/kv-transfer``; the prefiller keeps a finished prefill's KV until it is read or
expires. One object per pod, as it owns the HTTP client the reads share."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from modelsim.engine import Engine
from modelsim.openai_api import ApiError, error_body, parse_json
from modelsim.pd import HOLD_TIMEOUT_S, TransferParams, prefill_answer
from modelsim.replies import json_reply
from modelsim.sequence import Seq

if TYPE_CHECKING:
    from modelsim.server import Pod


class KVTransfer:
    """One pod's side of P/D: reading KV from prefillers, holding and serving its own."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self._client: aiohttp.ClientSession | None = None  # reads KV from prefill pods

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/sim/kv-transfer", self.serve)]

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def read_remote(self, params: TransferParams) -> bool:
        """Read a prompt's KV from the prefill pod; False (recompute here) when that fails."""
        stats = self.pod.engine.stats
        if self._client is None:
            self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        host = f"[{params.remote_host}]" if ":" in (params.remote_host or "") else params.remote_host
        url = f"http://{host}:{params.remote_port}/sim/kv-transfer"
        try:
            async with self._client.post(url, json={"remote_request_id": params.remote_request_id}) as r:
                answer = await r.json() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("bytes"), int):
            stats.nixl_failed_transfers += 1
            return False
        stats.nixl_bytes.observe(answer["bytes"])
        stats.nixl_xfer_time.observe(float(answer.get("transfer_s", 0.0)))
        return True

    async def serve(self, request: web.Request) -> web.Response:
        """A decode pod reads a held prefill's KV: answers after the link time, then frees it."""
        pod = self.pod
        try:
            body = parse_json(await request.read())
            rid = body.get("remote_request_id")
            if not isinstance(rid, str) or not rid.isdigit():
                raise ApiError(400, "'remote_request_id' must be a request id string")
        except ApiError as exc:
            return json_reply(exc.status, exc.body(), pod.name)
        engine = next((e for e in pod.ranks if int(rid) in e.held), pod.engine)
        seq = engine.held.get(int(rid))
        if seq is None:
            return json_reply(
                404, error_body(404, f"no KV held for request {rid} (read or expired)"), pod.name
            )
        tokens = seq.num_prompt
        seconds = engine.profile.kv_transfer_s(tokens)
        await pod.clock.sleep(seconds)
        if engine.release_held(seq.request_id) is None:
            return json_reply(
                404, error_body(404, f"the KV of request {rid} expired during the transfer"), pod.name
            )
        nbytes = tokens * engine.profile.kv_bytes_per_token
        return json_reply(200, {"tokens": tokens, "bytes": nbytes, "transfer_s": seconds}, pod.name)

    def hold(self, seq: Seq, engine: Engine) -> dict[str, Any]:
        """Keep a finished prefill-only request's KV (freed on read or after the timeout)."""

        def expire() -> None:
            if engine.release_held(seq.request_id) is not None:
                engine.stats.nixl_expired_reqs += 1

        pod = self.pod
        asyncio.get_running_loop().call_later(HOLD_TIMEOUT_S / pod.clock.time_scale, expire)
        return prefill_answer(pod.name, pod.host, pod.port, seq.request_id, list(seq.blocks))
