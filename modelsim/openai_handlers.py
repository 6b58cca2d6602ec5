"""A simulated pod's OpenAI-compatible API as vLLM serves it (formats in modelsim/openai_api.py
and modelsim/extra_api.py): chat and text completions, unary or streamed, embeddings,
responses, and vLLM's ``/v1/models`` and ``/tokenize``. A generation carrying
``kv_transfer_params`` is one half of disaggregated serving (modelsim/pd_transfer.py)."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from modelsim.engine import Engine
from modelsim.extra_api import embedding_response, parse_embedding, parse_responses, responses_response
from modelsim.openai_api import (
    ApiError,
    GenerationRequest,
    check_context,
    chunk,
    error_body,
    full_response,
    new_id,
    now_s,
    parse_generation,
    parse_json,
    prompt_ids_of,
    resolve_model,
    usage,
    usage_chunk,
)
from modelsim.pd import parse_transfer_params
from modelsim.replies import event_stream, json_reply, refusal
from modelsim.sequence import Seq

if TYPE_CHECKING:
    from modelsim.server import Pod


class OpenAIHandlers:
    """The OpenAI routes of one pod; each answers in OpenAI's error shape."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/completions", self.completions),
            web.post("/v1/embeddings", self.embeddings),
            web.post("/v1/responses", self.responses),
            web.get("/v1/models", self.models),
            web.post("/tokenize", self.tokenize),
        ]

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        pod = self.pod
        pod.note_trace(request)
        faulted = await pod.apply_faults()
        if faulted is not None:
            return faulted
        try:
            body = parse_json(await request.read())
            params = parse_transfer_params(body)
            if params is not None and params.do_remote_decode and body.get("stream"):
                raise ApiError(400, "a prefill-only request (do_remote_decode) must not stream")
            kv_from_remote = False
            if params is not None and params.do_remote_prefill:
                # validate the request before reading its KV
                parse_generation(body, kind, pod.config.model, pod.config.adapters, pod.tokenizer)
                kv_from_remote = await pod.kv_transfer.read_remote(params)
            engine = pod.engine_for(request.headers)
            req, seq = pod.admit(body, kind, kv_from_remote, engine)
        except (ApiError, ValueError) as exc:
            return refusal(exc, pod.name)
        try:
            if req.stream:
                return await self._stream(request, req, seq)
            return await self._unary(req, seq, engine)
        finally:
            engine.abort(seq)

    async def _unary(self, req: GenerationRequest, seq: Seq, engine: Engine) -> web.Response:
        parts: list[str] = []
        while True:
            ev = await seq.events.get()
            if ev.finish_reason is not None:
                break
            parts.append(ev.text)
        if ev.error is not None:
            return json_reply(500, error_body(500, ev.error), self.pod.name)
        use = usage(seq.num_prompt, seq.num_output, seq.cached_tokens)
        body = full_response(
            req.kind, new_id(req.kind), now_s(), req.served_model, "".join(parts), ev.finish_reason, use
        )
        if seq.hold_kv and seq.request_id in engine.held:
            body["kv_transfer_params"] = self.pod.kv_transfer.hold(seq, engine)
        return json_reply(200, body, self.pod.name)

    async def _stream(self, request: web.Request, req: GenerationRequest, seq: Seq) -> web.StreamResponse:
        resp = event_stream(self.pod.name)
        await resp.prepare(request)
        rid, created, model = new_id(req.kind), now_s(), req.served_model

        async def send(obj: Any) -> None:
            await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

        # A vanished client (or a crashed pod's aborted transport) ends the stream quietly.
        with contextlib.suppress(ConnectionError):
            if req.kind == "chat":
                await send(chunk(req.kind, rid, created, model, None, None))
            while True:
                ev = await seq.events.get()
                if ev.error is not None:
                    if self.pod.faults.crashed:
                        return resp
                    await send(error_body(500, ev.error))
                    break
                if ev.finish_reason is not None:
                    await send(chunk(req.kind, rid, created, model, "", ev.finish_reason))
                    if req.include_usage:
                        use = usage(seq.num_prompt, seq.num_output, seq.cached_tokens)
                        await send(usage_chunk(req.kind, rid, created, model, use))
                    break
                await send(chunk(req.kind, rid, created, model, ev.text, None))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        return resp

    async def embeddings(self, request: web.Request) -> web.Response:
        """Each input is prefilled (one output token, not returned): the engine's timing and load."""
        pod = self.pod
        faulted = await pod.apply_faults()
        if faulted is not None:
            return faulted
        c = pod.config
        try:
            req = parse_embedding(parse_json(await request.read()), c.model, c.adapters, pod.tokenizer)
            for ids in req.inputs:
                check_context(len(ids), 1, pod.engine.max_model_len)
            seqs = [pod.engine.submit(ids, 1, req.adapter) for ids in req.inputs]
        except (ApiError, ValueError) as exc:
            return refusal(exc, pod.name)
        try:
            for seq in seqs:
                while (ev := await seq.events.get()).finish_reason is None:
                    pass
                if ev.error is not None:
                    return json_reply(500, error_body(500, ev.error), pod.name)
        finally:
            for seq in seqs:
                pod.engine.abort(seq)
        return json_reply(200, embedding_response(req), pod.name)

    async def responses(self, request: web.Request) -> web.Response:
        pod = self.pod
        faulted = await pod.apply_faults()
        if faulted is not None:
            return faulted
        c = pod.config
        try:
            body = parse_json(await request.read())
            req = parse_responses(body, c.model, c.adapters, pod.tokenizer, pod.responses)
            check_context(len(req.prompt_ids), req.max_tokens, pod.engine.max_model_len)
            max_tokens = req.max_tokens or pod.engine.default_max_tokens(req.prompt_ids, None)
            seq = pod.engine.submit(req.prompt_ids, max_tokens, req.adapter)
        except (ApiError, ValueError) as exc:
            return refusal(exc, pod.name)
        try:
            parts: list[str] = []
            while (ev := await seq.events.get()).finish_reason is None:
                parts.append(ev.text)
            if ev.error is not None:
                return json_reply(500, error_body(500, ev.error), pod.name)
        finally:
            pod.engine.abort(seq)
        text = "".join(parts)
        if req.store:
            pod.responses.put(req.response_id, [*req.messages, {"role": "assistant", "content": text}])
        out = responses_response(
            req, text, seq.num_prompt, seq.num_output, seq.cached_tokens, ev.finish_reason
        )
        return json_reply(200, out, pod.name)

    async def models(self, _: web.Request) -> web.Response:
        c = self.pod.config
        created = now_s()
        base = {
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "max_model_len": self.pod.engine.max_model_len,
        }
        data = [{**base, "id": c.model, "root": c.model, "parent": None}]
        data += [{**base, "id": a, "root": f"/adapters/{a}", "parent": c.model} for a in c.adapters]
        return json_reply(200, {"object": "list", "data": data}, self.pod.name)

    async def tokenize(self, request: web.Request) -> web.Response:
        pod = self.pod
        try:
            body = parse_json(await request.read())
            resolve_model(body, pod.config.model, pod.config.adapters)
            kind = "chat" if "messages" in body else "completion"
            ids = prompt_ids_of(body, kind, pod.tokenizer)
        except ApiError as exc:
            return json_reply(exc.status, exc.body(), pod.name)
        out = {
            "count": len(ids),
            "max_model_len": pod.engine.max_model_len,
            "tokens": ids,
            "token_strs": None,
        }
        return json_reply(200, out, pod.name)
