"""A simulated pod's Anthropic Messages API (formats in modelsim/anthropic_api.py): served as
the chat completion it converts to, as vLLM does, answered in Anthropic's shapes."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from aiohttp import web

from modelsim import anthropic_api
from modelsim.openai_api import ApiError, GenerationRequest, parse_json, prompt_ids_of, resolve_model
from modelsim.replies import event_stream, json_reply
from modelsim.sequence import Seq

if TYPE_CHECKING:
    from modelsim.server import Pod


class AnthropicHandlers:
    """The Anthropic routes of one pod; each answers in Anthropic's error shape."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self.messages),
            web.post("/v1/messages/count_tokens", self.count_tokens),
        ]

    async def messages(self, request: web.Request) -> web.StreamResponse:
        pod = self.pod
        pod.note_trace(request)
        faulted = await pod.apply_faults(anthropic_api.error_body)
        if faulted is not None:
            return faulted
        try:
            body = anthropic_api.chat_body(parse_json(await request.read()))
            engine = pod.engine_for(request.headers)
            req, seq = pod.admit(body, "chat", engine=engine)
        except ApiError as exc:
            return json_reply(exc.status, anthropic_api.error_body(exc.status, exc.message), pod.name)
        except ValueError as exc:
            return json_reply(400, anthropic_api.error_body(400, str(exc)), pod.name)
        try:
            if req.stream:
                return await self._stream(request, req, seq)
            parts: list[str] = []
            while (ev := await seq.events.get()).finish_reason is None:
                parts.append(ev.text)
            if ev.error is not None:
                return json_reply(500, anthropic_api.error_body(500, ev.error), pod.name)
            answer = anthropic_api.message(
                anthropic_api.new_message_id(),
                req.served_model,
                "".join(parts),
                ev.finish_reason,
                seq.num_prompt,
                seq.num_output,
            )
            return json_reply(200, answer, pod.name)
        finally:
            engine.abort(seq)

    async def _stream(self, request: web.Request, req: GenerationRequest, seq: Seq) -> web.StreamResponse:
        resp = event_stream(self.pod.name)
        await resp.prepare(request)
        rid = anthropic_api.new_message_id()
        with contextlib.suppress(ConnectionError):  # a vanished client ends the stream quietly
            for event in anthropic_api.stream_start(rid, req.served_model, seq.num_prompt):
                await resp.write(anthropic_api.sse(event))
            while True:
                ev = await seq.events.get()
                if ev.error is not None:
                    if self.pod.faults.crashed:
                        return resp
                    await resp.write(anthropic_api.sse(anthropic_api.error_body(500, ev.error)))
                    break
                if ev.finish_reason is not None:
                    for event in anthropic_api.stream_end(ev.finish_reason, seq.num_output):
                        await resp.write(anthropic_api.sse(event))
                    break
                await resp.write(anthropic_api.sse(anthropic_api.text_delta(ev.text)))
            await resp.write_eof()
        return resp

    async def count_tokens(self, request: web.Request) -> web.Response:
        """`/v1/messages/count_tokens`: the prompt's token count; nothing runs on the engine."""
        pod = self.pod
        faulted = await pod.apply_faults(anthropic_api.error_body)
        if faulted is not None:
            return faulted
        c = pod.config
        try:
            body = anthropic_api.chat_body(parse_json(await request.read()), count_only=True)
            resolve_model(body, c.model, c.adapters)
            ids = prompt_ids_of(body, "chat", pod.tokenizer)
        except ApiError as exc:
            return json_reply(exc.status, anthropic_api.error_body(exc.status, exc.message), pod.name)
        return json_reply(200, {"input_tokens": len(ids)}, pod.name)
