"""Strict decoding of a request body, shared by every ext_proc service that reads one."""

from __future__ import annotations

import json

from extproc.errors import ErrorResponse, bad_request


def decode_json_object(body: bytes) -> dict | ErrorResponse:
    """UTF-8, JSON, an object; anything else is a clear 400."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return bad_request("request body is not valid UTF-8", "invalid_encoding")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return bad_request(f"request body is not valid JSON: {exc.msg} at position {exc.pos}", "invalid_json")
    except RecursionError:
        return bad_request("request body is nested too deeply", "invalid_json")
    if not isinstance(data, dict):
        return bad_request("request body must be a JSON object", "invalid_json")
    return data
