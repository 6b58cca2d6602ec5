"""The EPP's per-request lifecycle on one ext_proc stream.

headers+body in -> parse -> schedule -> admission (or, with flow control, a wait in the EPP's
queue while the pool is saturated) -> destination header and `envoy.lb` metadata out; then
response events. What the pick records lives in its `Booking` (epp/requestcontrol/booking.py),
released in `on_close`, which the stream layer calls exactly once whatever happens; the
processor keeps the request's protocol state.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any

from epp.datalayer.endpoint_records import Endpoint, PoolSnapshot
from epp.requestcontrol import conformance_mode
from epp.requestcontrol.admission import admit
from epp.requestcontrol.booking import Booking
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.decision_span import span_attributes
from epp.requestcontrol.dp_ranks import RANK_HEADER
from epp.requestcontrol.flow_control import FlowController, Outcome, Result, ticket_for
from epp.requestcontrol.flow_queue import band_of
from epp.requestcontrol.parse import ParsedBody, parse_body
from epp.requestcontrol.request_record import request_record, route_here
from epp.scheduling.affinity import pin_to_producer, response_id_for
from epp.scheduling.decision import Decision
from epp.scheduling.registry import cached_share
from epp.scheduling.request import InferenceRequest
from extproc.errors import (
    COUNT_TOKENS_PATH,
    ErrorResponse,
    is_anthropic_path,
    rate_limited,
    request_path,
    unavailable,
)
from extproc.headers import DECISION_HEADER, DESTINATION_HEADER, MODEL_HEADER, SERVED_HEADER
from extproc.stream import RequestRoute
from gateway.config import ModelRoute
from gateway.tracing import Attributes

log = logging.getLogger(__name__)


METADATA_NAMESPACE = "envoy.lb"
SPAN_NAME = "epp.schedule"
RESPONSES_PATH = "/v1/responses"


class EppProcessor:
    def __init__(self, ctx: EppContext) -> None:
        self._ctx = ctx
        self.max_body_bytes = ctx.config().bbr.max_body_bytes
        self._booking: Booking | None = None  # what the pick recorded, until released
        self._status: int | None = None
        self._explain: str | None = None  # returned on the response when the client asked
        # What the decision span describes (gateway/tracing.py; read only when tracing is on).
        self._parsed: InferenceRequest | None = None
        self._decision: Decision | None = None
        self._scheduling_s = 0.0
        self._body: ParsedBody | None = None  # the parsed request body
        self._sent_as: str | None = None  # the model a single-hop rewrite sends it as

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        return await self.on_parsed(headers, parse_body(headers, body, self._ctx.parse_hints()))

    async def on_prepared(
        self, headers: dict[str, str], body: bytes, prepared: Any
    ) -> RequestRoute | ErrorResponse:
        """`on_request` with the parse done by an ext_proc worker (extproc/remote.py)."""
        return await self.on_parsed(headers, ParsedBody.from_wire(prepared, body))

    async def on_parsed(self, headers: dict[str, str], parsed: ParsedBody) -> RequestRoute | ErrorResponse:
        """The decision for a parsed request (`on_request` parses here; an ext_proc worker of a
        multi-core EPP parses in its own process and hands over the record, epp/requestcontrol/parse.py)."""
        if not parsed.raw and MODEL_HEADER not in headers:
            # Not an inference request (GET /v1/models, health): Envoy answers it on its own route.
            return RequestRoute()
        span = self._ctx.tracing.begin(SPAN_NAME, headers)  # None unless tracing is on
        outcome = await self._decide(headers, self._parse(headers, parsed))
        # The upstream request carries this span as its parent (replacing BBR's traceparent).
        return self._ctx.tracing.finish_route(span, outcome, lambda: self.span_attributes(outcome))

    async def schedule(
        self, headers: dict[str, str], parsed: ParsedBody, route: ModelRoute, model: str
    ) -> RequestRoute | ErrorResponse:
        """A body already parsed and routed to this pool as `model` (the single-hop EPP did
        BBR's part): schedule, admit (or queue). The caller traces."""
        return await self._decide(headers, self._parse_routed(headers, parsed, route, model))

    async def _decide(
        self, headers: dict[str, str], request: InferenceRequest | ErrorResponse
    ) -> RequestRoute | ErrorResponse:
        started = time.perf_counter()
        if isinstance(request, ErrorResponse):
            self._ctx.telemetry.request_error(headers.get(MODEL_HEADER, ""), request.code)
            return request
        if request_path(headers.get(":path")) == COUNT_TOKENS_PATH:
            return self._count_tokens(request, headers, started)
        request = await self._with_tokens(request, headers)
        self._parsed = request
        if self._ctx.empty_pool is not None and not self._ctx.pool.has_ready():
            held = await self._hold_while_empty(request)
            if held is not None:
                return held
        decision = self._decision = self._pick(request, headers)
        self._scheduling_s = time.perf_counter() - started
        self._ctx.telemetry.scheduled(self._scheduling_s)
        if decision.slo_met is False and band_of(request.priority) == "sheddable":
            # No pod is predicted to meet its latency objective (epp/scheduling/slo.py): a
            # sheddable request is refused rather than sent late; others take the least-bad pod.
            self._ctx.telemetry.request_error(request.model, "slo_unattainable")
            log.info(
                "request %s refused: no pod meets its %.0f ms TTFT objective",
                request.request_id,
                (request.slo_ttft_s or 0.0) * 1000,
            )
            return rate_limited(
                f"no pod is predicted to answer within the {((request.slo_ttft_s or 0.0) * 1000):.0f} ms "
                "time-to-first-token objective; retry later",
                self._ctx.config().admission.retry_after_s,
                "slo_unattainable",
            )
        if (
            (flow := self._ctx.flow) is not None
            and flow.enabled
            and decision.ranked
            and (decision.waits or flow.must_queue(band_of(request.priority)))
        ):
            self._ctx.telemetry.queued(decision)
            return await self._wait_in_queue(flow, request, headers)
        refusal = admit(request, decision, self._ctx.config())
        if refusal is not None:
            self._ctx.telemetry.request_error(request.model, refusal.code)
            log.info("request %s refused: %s", request.request_id, refusal.code)
            return refusal
        return self._route(request, decision, headers)

    async def _hold_while_empty(self, request: InferenceRequest) -> ErrorResponse | None:
        """Scale from zero (epp/requestcontrol/scale_from_zero.py): with no ready pod, wait for one up to the
        pool's `scaleFromZero.maxWaitMs`; a 503 with Retry-After when none came. None: go on."""
        hold, pool = self._ctx.empty_pool, self._ctx.pool
        if hold is None:
            return None
        config = self._ctx.config()
        wait = config.pool(self._ctx.pool_name).scale_from_zero
        if wait is None:
            return None
        if await hold.wait(pool.has_ready, wait.max_wait_ms / 1000.0):
            return None
        self._ctx.telemetry.request_error(request.model, "no_endpoint_available")
        log.info("request %s refused: no ready pod within %d ms", request.request_id, wait.max_wait_ms)
        refusal = unavailable(
            f"no pod of the pool serving model '{request.model}' became ready within "
            f"{wait.max_wait_ms} ms (scaling from zero); retry later"
        )
        return replace(refusal, headers={"retry-after": str(config.admission.retry_after_s)})

    def _count_tokens(
        self, request: InferenceRequest, headers: dict[str, str], started: float
    ) -> RequestRoute | ErrorResponse:
        """`/v1/messages/count_tokens`: a pod of the model's pool tokenizes the prompt and runs
        no inference, so it holds no batch slot or KV blocks. It goes to the scheduler's best
        pod but is booked nowhere: no in-flight slot, ledger entry or prefix-index entry (that
        pod caches nothing of it), and it is neither queued nor refused as saturated, since it
        adds no load. Nothing is held, so `on_close` has nothing to return."""
        self._parsed = request
        decision = self._decision = self._pick(request, headers)
        self._scheduling_s = time.perf_counter() - started
        if not decision.ranked:
            self._ctx.telemetry.request_error(request.model, "no_endpoint_available")
            return unavailable(f"no endpoint can serve model '{request.model}': {decision.reason}")
        destination = decision.ranked[0]
        if self._ctx.header_policy.explain(headers):
            self._explain = explain(decision, self._ctx.pool.endpoint(destination))
        return RequestRoute(
            set_headers={DESTINATION_HEADER: destination},
            metadata={METADATA_NAMESPACE: {DESTINATION_HEADER: destination}},
            clear_route_cache=True,
        )

    async def _with_tokens(self, request: InferenceRequest, headers: dict[str, str]) -> InferenceRequest:
        """The request with the engine's token ids, when its model has a tokenizer and its
        profile reads them (precise-prefix-cache); long new text is tokenized off the loop.
        Its prompt size becomes their count, so every scorer (predicted-ttft's prefill beside
        the KV index's cached tokens) and the in-flight token accounting count real tokens.
        Not for Anthropic's Messages API: the engine renders its blocks (tools, tool calls) by
        its own conversion, which the EPP does not reproduce, so those requests keep the
        approximate prefix hashes."""
        tokenizers, body = self._ctx.tokenizers, self._body
        if is_anthropic_path(headers.get(":path")):
            return request
        if tokenizers is None or body is None or tokenizers.get(request.target_model) is None:
            return request
        if not self._ctx.scheduler.wants_tokens(request):
            return request
        ids = await tokenizers.token_ids(request.target_model, body.data())
        if ids is None:
            return request
        return replace(request, token_ids=ids, prompt_tokens=max(1, len(ids)))

    def _pick(self, request: InferenceRequest, headers: dict[str, str]) -> Decision:
        """The scheduler's decision; in a disaggregated pool, a decode pod and maybe a prefill pod."""
        return self._ctx.scheduler.pick(request, self._snapshot(request, headers))

    def _snapshot(self, request: InferenceRequest, headers: dict[str, str]) -> PoolSnapshot:
        """The pool, or only the pod holding `previous_response_id` (epp/scheduling/affinity.py),
        or in conformance test mode the pods the test header names (epp/requestcontrol/conformance_mode.py)."""
        snapshot = pin_to_producer(self._ctx.pool.snapshot(), request.previous_response_id)
        if self._ctx.conformance_test_mode:
            snapshot = conformance_mode.restrict(headers, snapshot)
        return snapshot

    async def _wait_in_queue(
        self, flow: FlowController, request: InferenceRequest, headers: dict[str, str]
    ) -> RequestRoute | ErrorResponse:
        """`Decision.waits` (saturated, or held for home): wait in the EPP's queue (flow_control.py)."""
        config = self._ctx.config()

        def attempt() -> RequestRoute | ErrorResponse | None:
            decision = self._pick(request, headers)
            if decision.waits and decision.ranked:
                return None
            self._decision = decision
            return self._route(request, decision, headers)

        ticket = ticket_for(
            request.priority, headers, self._ctx.header_policy, config.flow_control, request.slo_ttft_s
        )
        result: Result[RequestRoute | ErrorResponse] = await flow.wait(ticket, attempt)
        if result.outcome is Outcome.DISPATCHED and result.value is not None:
            return result.value
        if result.outcome is Outcome.OVERFLOW:
            code, why = "flow_control_queue_full", f"the {ticket.band} queue is full"
        else:
            code, why = "flow_control_timeout", f"waited {result.waited_s:.2f} s in the {ticket.band} queue"
        self._ctx.telemetry.request_error(request.model, code)
        log.info("request %s refused: %s (tenant %s)", request.request_id, code, ticket.tenant)
        return rate_limited(
            f"the model pool is saturated; {why}; retry later", config.admission.retry_after_s, code
        )

    def _route(
        self, request: InferenceRequest, decision: Decision, headers: dict[str, str]
    ) -> RequestRoute | ErrorResponse:
        """Send the request to the decision's best pod and take its in-flight slot."""
        if not decision.ranked:
            self._ctx.telemetry.request_error(request.model, "no_endpoint_available")
            return unavailable(f"no endpoint can serve model '{request.model}': {decision.reason}")
        address = decision.ranked[0]
        destination = ",".join(decision.ranked[: 1 + self._ctx.fallback_endpoints])
        scores = decision.scores.get(address, {})
        prefix = cached_share(scores)
        if prefix is not None:
            self._ctx.telemetry.prefix_lookup(prefix)
        booking = self._booking = Booking.book(self._ctx, request, decision)
        self._ctx.telemetry.routed(request)
        if self._ctx.header_policy.explain(headers):  # the client asked and may see the fleet
            self._explain = explain(decision, self._ctx.pool.endpoint(address))
        set_headers = {DESTINATION_HEADER: destination}
        endpoint = self._ctx.pool.endpoint(address)
        if endpoint is not None and endpoint.data_parallel_size > 1:
            set_headers[RANK_HEADER] = str(booking.pin_rank(endpoint.data_parallel_size))
        if decision.prefill is not None:
            booking.book_prefill(decision.prefill)
            set_headers.update(prefiller_header(self._ctx, decision.prefill))
        return RequestRoute(
            set_headers=set_headers,
            metadata={METADATA_NAMESPACE: {DESTINATION_HEADER: destination}},
            clear_route_cache=True,
            body=tagged_body(self._body, self._sent_as, headers, address),
        )

    def span_attributes(self, outcome: RequestRoute | ErrorResponse) -> Attributes:
        return span_attributes(self._ctx.pool_name, self._parsed, self._decision, self._scheduling_s, outcome)

    def _parse(self, headers: dict[str, str], parsed: ParsedBody) -> InferenceRequest | ErrorResponse:
        """The parsed body as this pool's request: its model routed here (or refused)."""
        route = route_here(self._ctx, headers, parsed)
        if isinstance(route, ErrorResponse):
            return route
        return self._parse_routed(headers, parsed, route)

    def _parse_routed(
        self, headers: dict[str, str], parsed: ParsedBody, route: ModelRoute, model: str | None = None
    ) -> InferenceRequest | ErrorResponse:
        request = request_record(self._ctx, headers, parsed, route, model)
        if not isinstance(request, ErrorResponse):
            self._body = parsed
            if model is not None and model != parsed.fields.model:  # type: ignore[union-attr]
                self._sent_as = model
        return request

    @property
    def answers_response_headers(self) -> bool:
        """Whether `on_response_headers` may return headers (the decision header the client
        asked for, conformance mode's served-endpoint header): a worker (epp/workers/processes.py) then
        waits for the answer; otherwise it only reports the event."""
        return self._explain is not None or self._ctx.conformance_test_mode

    def on_response_headers(self, headers: dict[str, str]) -> dict[str, str] | None:
        booking = self._booking
        if booking is None:  # nothing booked (count_tokens): only the decision, if asked
            return {DECISION_HEADER: self._explain} if self._explain else None
        status = headers.get(":status", "0")
        self._status = int(status) if status.isdigit() else 0
        booking.release_prefill()
        served = headers.get(SERVED_HEADER)
        if served:
            booking.move(served)
        booking.responded(self._status)
        out = {DECISION_HEADER: self._explain} if self._explain else {}
        if self._ctx.conformance_test_mode:
            out[conformance_mode.SERVED_RESULT_HEADER] = (
                served or "fail: the gateway reported no served endpoint"
            )
        return out or None

    def on_response_body(self, chunk: bytes, end_of_stream: bool) -> None:
        return None

    def on_close(self, completed: bool) -> None:
        booking, self._booking = self._booking, None  # exactly once, even if called again
        # Aborted: a 5xx, or closed before any response (with the response headers watched).
        aborted = self._status >= 500 if self._status is not None else not completed
        if booking is None or not booking.release(aborted):
            return
        request = booking.request
        # Response bodies are not streamed to the EPP (a gRPC round trip per SSE chunk would
        # cost more than the scheduling itself); the route asks for response trailers, so Envoy
        # closes this stream only when the HTTP stream ends (last byte, reset or abort), which
        # is what releases the in-flight slot. Speed comes from the scrape.
        # Without the response headers event (listener.eppResponseHeaders: auto) the status is
        # not seen here: the request counts as served (Envoy's own stats have the status).
        ok = self._status is None or self._status < 500
        self._ctx.telemetry.finished(request, ok=ok, duration=self._ctx.pool.clock() - booking.routed_at)


def prefiller_header(ctx: EppContext, prefill: str) -> dict[str, str]:
    """The prefill pod, named to the decode pod's sidecar."""
    header = ctx.config().pool(ctx.pool_name).disaggregation
    name = header.prefiller_header if header is not None else "x-prefiller-host-port"
    return {name: f"http://{prefill}" if name == "x-prefiller-url" else prefill}


def tagged_body(
    body: ParsedBody | None, sent_as: str | None, headers: dict[str, str], address: str
) -> bytes | None:
    """/v1/responses without a `request_id`: name the producing pod in the response id (the body
    sent as `sent_as` when a single-hop EPP rewrote its model)."""
    if body is None or headers.get(":path", "").split("?", 1)[0] != RESPONSES_PATH:
        return None
    data = body.data()
    if "request_id" in data:
        return None
    if sent_as is not None:
        data = {**data, "model": sent_as}
    return json.dumps({**data, "request_id": response_id_for(address)}, separators=(",", ":")).encode()


def explain(decision: Decision, chosen: Endpoint | None = None) -> str:
    """The chosen pod first (address and name: tied scores cannot tell the winner), then the
    compact per-pod scores, best first, with the predicted milliseconds to first token where the
    profile predicts them:
    `chosen=10.0.0.1:8000 pod=llama-0; profile=chat; 10.0.0.1:8000 total=4.10 kv=0.90, ...`"""
    head = f"chosen={decision.ranked[0]}"
    if chosen is not None and chosen.name:
        head += f" pod={chosen.name}"
    parts, predicted = [], decision.predicted or {}
    for address in decision.ranked:
        scores = decision.scores.get(address, {})
        detail = " ".join(f"{k}={v:.3f}" for k, v in sorted(scores.items()))
        if address in predicted:  # the prediction behind predicted-ttft, in milliseconds
            detail += f" predicted-ms={predicted[address] * 1000:.0f}"
        parts.append(f"{address} {detail}".strip())
    if decision.prefill is not None:
        head += f" prefill={decision.prefill}"
    return f"{head}; profile={decision.profile}; " + ", ".join(parts)
