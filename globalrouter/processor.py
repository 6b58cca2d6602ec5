"""The global router's request-side ext_proc processor: rate-limit, then pick a member cluster.

Tenant budget check (Redis), then the policy picks a member and we set `x-global-cluster`,
which selects the Envoy route to that member. The decision travels on as dynamic metadata
(`global.route`: member, tenant, prompt estimate) to the observer filter, which watches the
response (passive health, token metering; see observer.py). Metered tenants also get
`x-global-meter`, selecting the route variant on which the observer reads response bodies:
unmetered requests pay for no body events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from extproc.errors import ErrorResponse, rate_limited, unavailable
from extproc.stream import RequestRoute
from gateway.supervise import report_failure
from globalrouter.config import RouterConfig
from globalrouter.members import MemberBook
from globalrouter.policy import candidates, choose
from globalrouter.ratelimit import RateLimiter, tenant_of
from globalrouter.telemetry import Telemetry
from globalrouter.usage import prompt_token_estimate

log = logging.getLogger(__name__)

CLUSTER_HEADER = "x-global-cluster"  # request: which member route Envoy takes
UPSTREAM_HEADER = "x-global-upstream"  # response: the member address Envoy really reached
MEMBER_HEADER = "x-global-member"  # response: the member route taken (for clients and tests)
METER_HEADER = "x-global-meter"  # request: count this response's tokens (route variant with bodies)
ROUTE_NAMESPACE = "global.route"  # dynamic metadata from the router filter to the observer filter


@dataclass
class RouterContext:
    """Everything one replica's processors share; owned by one asyncio loop."""

    config: RouterConfig
    book: MemberBook
    limiter: RateLimiter | None
    telemetry: Telemetry
    clock: Callable[[], float] = time.monotonic
    rand: Callable[[], float] = random.random
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Fire and forget, but never silently: a failure is logged and counted."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            report_failure("globalrouter-background", task.get_name(), exc)


def _request_facts(body: bytes) -> tuple[str | None, bool]:
    """The model and whether the client asked for a stream; lenient: the cluster validates."""
    if not body:
        return None, False
    try:
        data = json.loads(body)
    except ValueError:
        return None, False
    if not isinstance(data, dict):
        return None, False
    model = data.get("model")
    return (model if isinstance(model, str) and model else None), data.get("stream") is True


class GlobalProcessor:
    def __init__(self, ctx: RouterContext) -> None:
        self._ctx = ctx
        self.max_body_bytes = ctx.config.max_body_bytes

    async def on_request(self, headers: dict[str, str], body: bytes) -> RequestRoute | ErrorResponse:
        ctx = self._ctx
        tenant = tenant_of(headers, ctx.config.tenant_header)
        metered = False
        if ctx.limiter is not None:
            verdict = await ctx.limiter.admit(tenant)
            if not verdict.admitted:
                ctx.telemetry.refused.labels(f"rate_limited_{verdict.refused_by}").inc()
                return rate_limited(
                    f"tenant rate limit exceeded ({verdict.refused_by} per {ctx.config.rate_limits.window_s:g} s)",
                    verdict.retry_after_s,
                    code=f"rate_limit_{verdict.refused_by}",
                )
            metered = ctx.limiter.limit_for(tenant).tokens is not None
        model, streaming = _request_facts(body)
        now = ctx.clock()
        region = headers.get(ctx.config.region_header) or None
        choice = choose(candidates(ctx.book, model, region, now), ctx.config.ttft_objective_s, ctx.rand)
        if choice is None:
            ctx.telemetry.refused.labels("no_cluster_available").inc()
            what = f"model {model!r}" if model else "this request"
            return unavailable(f"no member cluster can serve {what} now", code="no_cluster_available")
        ctx.book.note_routed(choice.name, now)
        ctx.telemetry.routed.labels(choice.name, choice.reason).inc()
        route = {
            "member": choice.name,
            "tenant": tenant,
            "metered": "1" if metered else "0",
            "routed_unix_ms": f"{time.time() * 1000:.1f}",  # wall clock: the observer may be another replica
        }
        if metered:
            route["prompt_tokens"] = str(prompt_token_estimate(body))
            route["streaming"] = "1" if streaming else "0"
        set_headers = {CLUSTER_HEADER: choice.name}
        if metered:
            set_headers[METER_HEADER] = "1"
        return RequestRoute(
            set_headers=set_headers, metadata={ROUTE_NAMESPACE: route}, clear_route_cache=True
        )

    # The router filter skips response events: the observer filter watches responses.
    def on_response_headers(self, headers: dict[str, str]) -> None:
        return None

    def on_response_body(self, chunk: bytes, end_of_stream: bool) -> None:
        return None

    def on_close(self, completed: bool) -> None:
        return None
