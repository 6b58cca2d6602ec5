"""Count the LLM tokens of a response from its body, chunk by chunk, in bounded memory.

JSON responses carry `usage.total_tokens`. SSE streams carry it in the last chunk only when
the client asked (`stream_options.include_usage`); otherwise we count content chunks (one
per token for OpenAI-compatible servers) plus the prompt estimate made from the request.
"""

from __future__ import annotations

import json
from typing import Any

MAX_JSON_BYTES = 4 * 1024 * 1024  # responses larger than this are estimated, not parsed


def _total(usage: Any) -> int | None:
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int) and total >= 0:
        return total
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    if all(isinstance(p, int) and p >= 0 for p in parts):
        return int(parts[0]) + int(parts[1])  # type: ignore[arg-type]
    return None


class UsageMeter:
    def __init__(self, *, streaming: bool, prompt_estimate: int) -> None:
        self.streaming = streaming
        self.prompt_estimate = prompt_estimate
        self._buf = bytearray()
        self._overflow = False
        self._events = 0
        self._reported: int | None = None
        self.done = False

    def feed(self, chunk: bytes, end_of_stream: bool) -> None:
        if self.done:
            return
        if self.streaming:
            self._feed_sse(chunk)
        elif not self._overflow:
            self._buf += chunk
            if len(self._buf) > MAX_JSON_BYTES:
                self._overflow = True
                self._buf.clear()
        if end_of_stream:
            self._finish()

    def _feed_sse(self, chunk: bytes) -> None:
        self._buf += chunk
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > MAX_JSON_BYTES:  # a runaway line: stop buffering it
                    self._buf.clear()
                return
            line = bytes(self._buf[:nl]).strip()
            del self._buf[: nl + 1]
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                continue
            self._events += 1
            if b'"usage"' in data:
                try:
                    total = _total(json.loads(data).get("usage"))
                except (ValueError, AttributeError):
                    total = None
                if total is not None:
                    self._reported = total

    def _finish(self) -> None:
        self.done = True
        if not self.streaming and not self._overflow and self._buf:
            try:
                self._reported = _total(json.loads(self._buf).get("usage"))
            except (ValueError, AttributeError):
                self._reported = None
        self._buf.clear()

    @property
    def tokens(self) -> int:
        """Reported usage when present, else the estimate (prompt + one token per SSE event)."""
        if self._reported is not None:
            return self._reported
        return self.prompt_estimate + self._events


def prompt_token_estimate(body: bytes) -> int:
    """~4 bytes per token: good enough to charge a stream that reports no usage."""
    return max(1, len(body) // 4)
