"""Agent sessions: the session key and the agent program of a request, from what coding agents
already send (issue #51). Pure: headers (lower-case names, as Envoy hands them over) and a few
fields of the decoded body in, strings out; no I/O, no state.

The session key keys the `session-affinity` scorer and the KV memory of whole conversations
(epp/datalayer/session_memory.py), where a keyed conversation's next turn supersedes its entry
even when the agent compacted or rewrote the prompt. Its sources, first non-empty one wins:

1. the configured `sessionAffinity.header` (default `x-session-id`): the operator's choice, first.
2. `x-claude-code-session-id`: Claude Code sends a per-session UUID on every request since
   v2.1.86, documented in its gateway protocol reference at
   https://code.claude.com/docs/en/llm-gateway-protocol (request headers a gateway may consume)
   and relied on by gateways such as coder/aibridge (pull request #241).
3. `session_id` and `session-id`: the OpenAI Codex CLI's conversation id, set by
   `build_conversation_headers` in openai/codex codex-rs/codex-api/src/requests/headers.rs
   (`session_id`); newer releases send the hyphenated form (KarpelesLab/teamclaude pull
   request #352, router-for-me/CLIProxyAPI issue #4452).
4. `x-opencode-session` and `x-session-affinity`: opencode's session id, the first for its own
   providers, the second for the others (coder/coder pull request #26140; opencode sends
   `x-session-affinity` and, since v1.17, `X-Session-Id` with the same session id:
   BYK/loreai pull request #687).
5. `x-session-id`: the generic name (opencode since v1.17, OpenRouter clients), when the
   configured header is another one.
6. `x-grok-conv-id`: xAI's conversation id header, documented at
   https://docs.x.ai/developers/advanced-api-usage/prompt-caching/maximizing-cache-hits
7. the body's `metadata.user_id`, Anthropic Messages only where it carries a session: Claude
   Code before its session header put the session id there, as a JSON string with a
   `session_id` field or as a `..._session_<uuid>` suffix (coder/aibridge pull request #241).
8. the body's `prompt_cache_key`: OpenAI's cache routing key for requests that share a prefix
   (https://developers.openai.com/docs/guides/prompt-caching; the Codex CLI sets it on its
   Responses requests, openai/codex codex-rs/codex-api/src/common.rs), which xAI documents as
   equivalent to `x-grok-conv-id` (same page as 6). Last, because an application may share one
   key across many conversations.

A key is at most `MAX_KEY_CHARS` characters (a longer value is cut there) and an empty or
blank value counts as absent.

The agent program is one of a fixed set (`AGENTS`), from the `User-Agent` prefix the agent
sends, else from an agent's own session header; anything else is `other`, so a client cannot
mint identities without bound: flow control gives each program one fair share
(epp/requestcontrol/flow_control.py) and the request counter one label.
- `claude-code`: `claude-cli/<version> (external, cli)` (anthropics/claude-code issue #80191;
  Wei-Shaw/claude-relay-service issue #490) or `claude-code/<version>` (router-for-me/CLIProxyAPI
  issue #1621), else the `x-claude-code-session-id` header (obot-platform/obot pull request
  #7205 identifies Claude Code by it).
- `codex`: `codex_cli_rs/<version> (<os>; <arch>) ...` from the CLI and `codex_vscode/<version>`
  from its editor extension (the Codex originators, as mahaoyang/claude-relay-service
  docs/CODEX_SESSION_POOL.md records them).
- `opencode`: `opencode/<version>`, the User-Agent opencode sets for its own providers
  (packages/opencode/src/session/llm/request.ts in anomalyco/opencode), else the
  `x-opencode-session` header.
- `gemini-cli`: `GeminiCLI/<version> (<os>; <arch>)`, the format google-gemini/gemini-cli sends
  (reproduced by the gemini-cli proxies, e.g. geminicli2api).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MAX_KEY_CHARS = 256

# Header sources after the configured one, in order (lower-case, as Envoy passes them).
SESSION_HEADERS = (
    "x-claude-code-session-id",
    "session_id",
    "session-id",
    "x-opencode-session",
    "x-session-affinity",
    "x-session-id",
    "x-grok-conv-id",
)

OTHER = "other"
# User-Agent prefixes (lower-cased) -> program.
_USER_AGENTS = (
    ("claude-cli/", "claude-code"),
    ("claude-code/", "claude-code"),
    ("codex_cli_rs/", "codex"),
    ("codex_vscode/", "codex"),
    ("opencode/", "opencode"),
    ("geminicli/", "gemini-cli"),
)
# An agent's own session header names the program when its User-Agent does not.
_AGENT_HEADERS = (
    ("x-claude-code-session-id", "claude-code"),
    ("x-opencode-session", "opencode"),
)
AGENTS = frozenset({program for _, program in _USER_AGENTS}) | {OTHER}


def _clean(value: Any) -> str | None:
    """A usable key: a non-blank string, cut to MAX_KEY_CHARS."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value[:MAX_KEY_CHARS] if value else None


def _claude_metadata_session(user_id: Any) -> str | None:
    """The session id Claude Code puts in `metadata.user_id`: a JSON object's `session_id`,
    or what follows `_session_` in the older `user_<hash>_account_<id>_session_<uuid>` form."""
    if not isinstance(user_id, str):
        return None
    if user_id.startswith("{"):
        try:
            decoded = json.loads(user_id)
        except ValueError:
            return None
        return _clean(decoded.get("session_id")) if isinstance(decoded, dict) else None
    _, marker, session = user_id.rpartition("_session_")
    return _clean(session) if marker else None


def body_session_key(body: Mapping[str, Any]) -> str | None:
    """The session key a decoded body carries (sources 7 and 8 of the module docstring)."""
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        key = _claude_metadata_session(metadata.get("user_id"))
        if key is not None:
            return key
    return _clean(body.get("prompt_cache_key"))


def session_key(
    headers: Mapping[str, str], configured: str | None, body_key: str | None = None
) -> str | None:
    """The request's session key: the configured header, the agents' headers, then the body's
    (`body_key`, from `body_session_key`); None when none is set."""
    if configured:
        key = _clean(headers.get(configured.lower()))
        if key is not None:
            return key
    for name in SESSION_HEADERS:
        key = _clean(headers.get(name))
        if key is not None:
            return key
    return _clean(body_key)


def agent_program(headers: Mapping[str, str]) -> str:
    """The agent program of a request, one of `AGENTS`."""
    agent = headers.get("user-agent", "").lstrip().lower()
    for prefix, program in _USER_AGENTS:
        if agent.startswith(prefix):
            return program
    for name, program in _AGENT_HEADERS:
        if _clean(headers.get(name)) is not None:
            return program
    return OTHER
