"""The gateway's JSON errors, as ext_proc ImmediateResponses, in the shape of the API asked.

Clients of an OpenAI-compatible API parse `{"error": {"message", "type", "code"}}`; clients of
Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) parse
`{"type": "error", "error": {"type", "message"}}`. Every refusal is one `ErrorResponse`; the
request's path picks the shape it is written in (`json_body(path)`), so SDKs of either API
surface a readable message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# OpenAI's error `type` per HTTP status; anything else is a server error.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
}

# Anthropic's Messages API: its paths, and its error `type` per HTTP status (its documented
# errors; another 4xx is invalid_request_error, another 5xx api_error).
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
ANTHROPIC_PATHS = (MESSAGES_PATH, COUNT_TOKENS_PATH)
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def openai_error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def request_path(path: str | None) -> str:
    """A request's `:path` without its query string."""
    return (path or "").split("?", 1)[0]


def is_anthropic_path(path: str | None) -> bool:
    """Whether `path` (a `:path`, query string allowed) is one of Anthropic's Messages API."""
    return request_path(path) in ANTHROPIC_PATHS


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """A refusal: the HTTP status, a human message, a stable machine code, extra headers."""

    status: int
    message: str
    code: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def error_type(self) -> str:
        """OpenAI's error type for the status."""
        return openai_error_type(self.status)

    def json_body(self, path: str | None = None) -> bytes:
        """The body for a request to `path`: Anthropic's shape on its paths, else OpenAI's."""
        payload = error_payload(self.status, self.message, self.code, anthropic=is_anthropic_path(path))
        return json.dumps(payload, separators=(",", ":")).encode()


def error_payload(
    status: int, message: str, code: str, *, anthropic: bool, error_type: str | None = None
) -> dict[str, Any]:
    """One error as a JSON object in either API's shape (the services' refusals and Envoy's own
    replies, gateway/envoy/bootstrap.py, both write it here). OpenAI's carries `code` and
    `error_type` (default: by status); Anthropic's has a type by status and no code."""
    if anthropic:
        return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
    kind = error_type or openai_error_type(status)
    return {"error": {"message": message, "type": kind, "code": code}}


def bad_request(message: str, code: str = "invalid_request") -> ErrorResponse:
    return ErrorResponse(400, message, code)


def too_large(limit: int) -> ErrorResponse:
    return ErrorResponse(413, f"request body exceeds the limit of {limit} bytes", "request_too_large")


def unavailable(message: str, code: str = "no_endpoint_available") -> ErrorResponse:
    return ErrorResponse(503, message, code)


def rate_limited(message: str, retry_after_s: int, code: str = "pool_saturated") -> ErrorResponse:
    return ErrorResponse(429, message, code, headers={"retry-after": str(max(1, retry_after_s))})
