"""OpenAI-style JSON errors, as ext_proc ImmediateResponses.

Clients of an OpenAI-compatible API parse `{"error": {"message", "type", "code"}}`; every
refusal the gateway makes uses that shape so SDKs surface a readable message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """A refusal: the HTTP status, a human message, a stable machine code, extra headers."""

    status: int
    message: str
    code: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def error_type(self) -> str:
        return _ERROR_TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )

    def json_body(self) -> bytes:
        payload = {"error": {"message": self.message, "type": self.error_type, "code": self.code}}
        return json.dumps(payload, separators=(",", ":")).encode()


def bad_request(message: str, code: str = "invalid_request") -> ErrorResponse:
    return ErrorResponse(400, message, code)


def too_large(limit: int) -> ErrorResponse:
    return ErrorResponse(413, f"request body exceeds the limit of {limit} bytes", "request_too_large")


def unavailable(message: str, code: str = "no_endpoint_available") -> ErrorResponse:
    return ErrorResponse(503, message, code)


def rate_limited(message: str, retry_after_s: int, code: str = "pool_saturated") -> ErrorResponse:
    return ErrorResponse(429, message, code, headers={"retry-after": str(max(1, retry_after_s))})
