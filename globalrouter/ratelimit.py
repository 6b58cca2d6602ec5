"""Global per-tenant rate limits in requests and in LLM tokens, shared through Redis.

Sliding window of `buckets` slices per counter (a Redis hash: slice index -> count). One Lua
script checks and charges atomically inside Redis, using Redis's own clock, so every router
replica sees the same counters and the same time: replicas cannot over-admit by racing.

Requests are charged when admitted. Tokens are only known from the response (`usage`), so a
request is admitted while the tenant's token total is below its budget and the tokens are
charged afterwards: a tenant can overshoot by what its in-flight requests consume.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from globalrouter.config import RateLimits, TenantLimit

log = logging.getLogger(__name__)

# KEYS: 1 request counter, 2 token counter.
# ARGV: window_ms, slice_ms, request_limit (-1: none), token_limit (-1: none), add_requests, add_tokens.
# Returns {admitted (1/0), refused_by ("", "requests", "tokens"), retry_after_ms}.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
local slice = tonumber(ARGV[2])
local current = math.floor(now / slice)
local slices = math.floor(window / slice)
local oldest = current - slices + 1

local function total(key)
  local vals = redis.call('HGETALL', key)
  local sum, earliest = 0, nil
  for i = 1, #vals, 2 do
    local idx = tonumber(vals[i])
    if idx < oldest then
      redis.call('HDEL', key, vals[i])
    else
      sum = sum + tonumber(vals[i + 1])
      if earliest == nil or idx < earliest then earliest = idx end
    end
  end
  return sum, earliest
end

local function retry_ms(earliest)
  if earliest == nil then return slice end
  return (earliest + slices) * slice - now
end

local req_limit, tok_limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local add_req, add_tok = tonumber(ARGV[5]), tonumber(ARGV[6])
if tok_limit >= 0 then
  local used, earliest = total(KEYS[2])
  if used >= tok_limit then return {0, 'tokens', retry_ms(earliest)} end
end
if req_limit >= 0 then
  local used, earliest = total(KEYS[1])
  if used + add_req > req_limit then return {0, 'requests', retry_ms(earliest)} end
end
if add_req > 0 then
  redis.call('HINCRBY', KEYS[1], current, add_req)
  redis.call('PEXPIRE', KEYS[1], window + slice)
end
if add_tok > 0 then
  redis.call('HINCRBY', KEYS[2], current, add_tok)
  redis.call('PEXPIRE', KEYS[2], window + slice)
end
return {1, '', 0}
"""


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    refused_by: str = ""  # "requests" | "tokens"
    retry_after_s: int = 0
    degraded: bool = False  # Redis unreachable: decided by fail_open


def tenant_of(headers: dict[str, str], tenant_header: str) -> str:
    """Tenant: an explicit tenant header, else a digest of the bearer key (never the key itself)."""
    tenant = headers.get(tenant_header, "").strip()
    if tenant:
        return tenant[:128]
    auth = headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return "key-" + hashlib.sha256(key.strip().encode()).hexdigest()[:16]
    return "anonymous"


class RateLimiter:
    def __init__(self, config: RateLimits, client: aioredis.Redis | None = None) -> None:
        self.config = config
        if client is None and config.redis_url:
            # A bounded pool: a burst waits for a connection instead of opening hundreds at once
            # (which timed out and, failing open, over-admitted in our tests).
            pool = aioredis.BlockingConnectionPool.from_url(
                config.redis_url,
                max_connections=config.max_connections,
                timeout=config.timeout_s,
                socket_timeout=config.timeout_s,
                socket_connect_timeout=config.timeout_s,
            )
            client = aioredis.Redis(connection_pool=pool)
        self._redis = client
        self._script = client.register_script(_SCRIPT) if client is not None else None
        self._slice_ms = max(1, int(config.window_s * 1000 / config.buckets))
        self._window_ms = self._slice_ms * config.buckets
        self.redis_errors = 0

    def limit_for(self, tenant: str) -> TenantLimit:
        return self.config.limit_for(tenant)

    def _keys(self, tenant: str) -> list[str]:
        # One hash tag per tenant keeps both keys in one Redis Cluster slot.
        prefix = f"{self.config.key_prefix}:{{{tenant}}}"
        return [f"{prefix}:requests", f"{prefix}:tokens"]

    async def admit(self, tenant: str) -> Verdict:
        """Check both budgets and charge one request, atomically."""
        limit = self.limit_for(tenant)
        if limit.requests is None and limit.tokens is None:
            return Verdict(True)
        return await self._run(tenant, limit, add_requests=1, add_tokens=0)

    async def charge_tokens(self, tenant: str, tokens: int) -> None:
        limit = self.limit_for(tenant)
        if limit.tokens is None or tokens <= 0:
            return
        await self._run(tenant, TenantLimit(), add_requests=0, add_tokens=tokens)

    async def _run(self, tenant: str, limit: TenantLimit, *, add_requests: int, add_tokens: int) -> Verdict:
        if self._script is None:
            return Verdict(self.config.fail_open, "unavailable", 1, degraded=True)
        args = [
            self._window_ms,
            self._slice_ms,
            -1 if limit.requests is None else limit.requests,
            -1 if limit.tokens is None else limit.tokens,
            add_requests,
            add_tokens,
        ]
        try:
            admitted, refused_by, retry_ms = await self._script(keys=self._keys(tenant), args=args)
        except (RedisError, OSError) as exc:
            self.redis_errors += 1
            if self.redis_errors in (1, 10, 100) or self.redis_errors % 1000 == 0:
                log.warning("rate limiter: redis unavailable (%s); fail_open=%s", exc, self.config.fail_open)
            return Verdict(self.config.fail_open, "unavailable", 1, degraded=True)
        if isinstance(refused_by, bytes):
            refused_by = refused_by.decode()
        return Verdict(bool(admitted), refused_by, max(1, math.ceil(int(retry_ms) / 1000)))

    async def used(self, tenant: str) -> tuple[int, int]:
        """Requests and tokens currently counted in the window (diagnostics and tests)."""
        if self._redis is None:
            return 0, 0
        out = []
        for key in self._keys(tenant):
            values = await self._redis.hvals(key)
            out.append(sum(int(v) for v in values))
        return out[0], out[1]

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
