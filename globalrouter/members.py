"""What the router knows about each member cluster: heartbeats (active health), outcomes of
its own responses (passive health), in-flight requests, and when a returning member ramps.

One asyncio loop owns a `MemberBook`: no locks. Time is always passed in (monotonic seconds)
so the policy is testable without sleeping.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from globalrouter.config import Member, RouterConfig

TTFT_EWMA_ALPHA = 0.2  # weight of the newest observed time to response headers


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """One model on one cluster, as its last heartbeat said."""

    model: str
    ready_pods: int
    avg_kv_usage: float = 0.0
    avg_queue: float = 0.0
    running: float = 0.0
    inflight_requests: int = 0
    error_rate: float = 0.0
    capacity: int = 0
    ttft_s: float = 0.0
    tpot_s: float = 0.0


@dataclass(slots=True)
class MemberState:
    member: Member
    region: str
    cost_per_1k_tokens: float
    models: dict[str, ModelLoad] = field(default_factory=dict)
    draining: bool = False
    last_heartbeat: float | None = None
    ramp_from: float = float("-inf")  # when the member last became available again
    heartbeats: int = 0
    # passive health
    outcomes: deque[bool] = field(default_factory=deque)
    consecutive_failures: int = 0
    ejected_until: float = float("-inf")
    ejections: int = 0
    # this replica's own traffic
    recent: deque[float] = field(default_factory=deque)  # when we routed to it, newest last
    observed_ttft_s: float | None = None  # EWMA of time to response headers seen by our observer
    routed: int = 0
    failures: int = 0

    @property
    def name(self) -> str:
        return self.member.name


class MemberBook:
    def __init__(self, config: RouterConfig, *, started_at: float) -> None:
        self.config = config
        self.started_at = started_at
        self.members: dict[str, MemberState] = {
            m.name: MemberState(m, m.region, m.cost_per_1k_tokens or 0.0) for m in config.members
        }
        self._by_address = {m.address: m.name for m in config.members}

    # -- active health -----------------------------------------------------------------
    def heartbeat(
        self,
        name: str,
        now: float,
        *,
        region: str,
        cost_per_1k_tokens: float,
        draining: bool,
        models: list[ModelLoad],
    ) -> bool:
        """Record a heartbeat; False if `name` is not a configured member."""
        state = self.members.get(name)
        if state is None:
            return False
        first_at_startup = (
            state.last_heartbeat is None and now - self.started_at <= self.config.startup_grace_s
        )
        if not self._heartbeat_fresh(state, now) and not first_at_startup:
            state.ramp_from = now  # it was down (or joined late): come back gradually
        state.last_heartbeat = now
        state.heartbeats += 1
        state.region = region or state.member.region
        state.cost_per_1k_tokens = cost_per_1k_tokens
        state.draining = draining
        state.models = {m.model: m for m in models}
        return True

    def _heartbeat_fresh(self, state: MemberState, now: float) -> bool:
        return state.last_heartbeat is not None and now - state.last_heartbeat <= self.config.stale_after_s

    # -- passive health ----------------------------------------------------------------
    def record_outcome(self, name: str, ok: bool, now: float, *, hard: bool = False) -> None:
        """A response outcome. `hard` failures (connection refused: Envoy had to retry
        elsewhere) eject at once; others eject on a run or a high error rate."""
        state = self.members.get(name)
        if state is None:
            return
        ph = self.config.passive_health
        state.outcomes.append(ok)
        while len(state.outcomes) > ph.window:
            state.outcomes.popleft()
        if ok:
            state.consecutive_failures = 0
            return
        state.failures += 1
        state.consecutive_failures += 1
        failed = state.outcomes.count(False)
        rate_trip = len(state.outcomes) >= ph.min_requests and failed / len(state.outcomes) >= ph.error_rate
        if hard or rate_trip or state.consecutive_failures >= ph.consecutive_failures:
            self._eject(state, now)

    def _eject(self, state: MemberState, now: float) -> None:
        if state.ejected_until > now:
            return
        state.ejected_until = now + self.config.passive_health.eject_s
        state.ramp_from = state.ejected_until
        state.ejections += 1
        state.outcomes.clear()
        state.consecutive_failures = 0

    def note_routed(self, name: str, now: float) -> None:
        state = self.members[name]
        state.routed += 1
        state.recent.append(now)

    def recent_routed(self, state: MemberState, now: float) -> int:
        """Requests we sent it that its last heartbeat may not show yet (a burst between two)."""
        horizon = now - self.config.burst_window_s
        while state.recent and state.recent[0] < horizon:
            state.recent.popleft()
        return len(state.recent)

    def observe_ttft(self, name: str, seconds: float) -> None:
        state = self.members.get(name)
        if state is None or not 0 <= seconds < 3600:
            return
        old = state.observed_ttft_s
        state.observed_ttft_s = seconds if old is None else old + TTFT_EWMA_ALPHA * (seconds - old)

    def member_at(self, address: str) -> str | None:
        return self._by_address.get(address)

    # -- queries -----------------------------------------------------------------------
    def available(self, state: MemberState, now: float) -> bool:
        return self._heartbeat_fresh(state, now) and not state.draining and now >= state.ejected_until

    def ramp(self, state: MemberState, now: float) -> float:
        """Linear weight 0..1 since the member came back (min_ramp so it gets probed at all)."""
        ramp_s = self.config.ramp_s
        if ramp_s <= 0:
            return 1.0
        elapsed = now - state.ramp_from
        return max(self.config.min_ramp, min(1.0, elapsed / ramp_s))

    def serves(self, state: MemberState, model: str | None) -> ModelLoad | None:
        """The model's load if this member can take it now (ready pods, errors below the bound)."""
        if model is None:
            loads = [m for m in state.models.values() if m.ready_pods > 0]
            if not loads:
                return None
            return max(loads, key=lambda m: m.ready_pods)
        load = state.models.get(model)
        if load is None or load.ready_pods <= 0:
            return None
        if load.error_rate >= self.config.heartbeat_error_rate:
            return None
        return load
