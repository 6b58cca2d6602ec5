"""The reply shapes every HTTP handler of a simulated pod shares: JSON bodies and event streams,
each stamped with the pod's name (``x-modelsim-pod``) so a test sees which pod answered."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from modelsim.openai_api import ApiError, error_body

POD_HEADER = "x-modelsim-pod"


def json_reply(status: int, body: Any, pod: str) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers={POD_HEADER: pod}
    )


def event_stream(pod: str) -> web.StreamResponse:
    """A server-sent-events response, not yet prepared (OpenAI's and Anthropic's streams)."""
    return web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", POD_HEADER: pod}
    )


def refusal(exc: ApiError | ValueError, pod: str) -> web.Response:
    """A request refused in OpenAI's error shape: an ApiError with its status, else (a value the
    engine refuses) a 400."""
    if isinstance(exc, ApiError):
        return json_reply(exc.status, exc.body(), pod)
    return json_reply(400, error_body(400, str(exc)), pod)
