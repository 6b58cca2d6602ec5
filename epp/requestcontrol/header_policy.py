"""Which client request headers the EPP honours: the one place the trust rule lives.

Two headers change what the gateway does for a client: `x-gateway-decision` returns every
candidate pod's address and scores (the fleet's topology), and `x-gateway-inference-objective`
picks the scheduling profile, hence the request's priority (a sheddable model's clients could
otherwise escape shedding). The rule (docs/security.md, "Request headers"):

- A request is *trusted* when the listener says only internal callers reach it
  (`listener.trust.internal`), or when its verified JWT carries `listener.trust.jwtClaim`
  (Envoy's jwt_authn copies that claim into `CLAIM_HEADER` after verifying the token; the same
  header sent by a client is stripped before, so it cannot be forged).
- The decision header is honoured for trusted requests, or for everyone with
  `listener.trust.decisionHeader: true` (local development).
- A trusted request may name any defined profile. An untrusted one may name only the model's
  `objectives`, and its priority never exceeds that of the model's own profile. A header that
  may not be used is ignored: the request gets the model's default treatment.
- `x-gateway-slo-ttft-ms` (a time-to-first-token objective, docs/scheduling.md "Latency
  objectives") is honoured for trusted requests only; others get their profile's `sloTtftMs`.
- The header may also name an InferenceObjective of this EPP's pool (llm-d API, followed with
  `--inference-objectives`): its `priority` then replaces the profile's, for trusted requests
  as written, for untrusted ones capped at the model's own profile's priority (so it can lower
  a request's priority, never raise it above the model's). It is not gated by the model's
  `objectives`, which list profiles: the scheduling profile (weights) is still chosen by the
  rules above, so a name that is both a profile and an InferenceObjective takes its weights
  from the profile and its priority from the InferenceObjective.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from extproc.headers import CLAIM_HEADER, DECISION_HEADER, OBJECTIVE_HEADER, SLO_TTFT_HEADER
from gateway.config import GatewayConfig

_ASKED = ("1", "true", "yes")


@dataclass(frozen=True, slots=True)
class Objective:
    name: str  # the scheduling profile
    priority: int  # < 0: sheddable


@dataclass(frozen=True, slots=True)
class HeaderPolicy:
    """The trust settings and per-model profile rules of one configuration, ready per request."""

    decision_header: bool = False
    internal: bool = False
    claim_value: str | None = None
    default_profile: str = "default"
    priorities: Mapping[str, int] = field(default_factory=dict)  # profile -> priority
    model_profiles: Mapping[str, str] = field(default_factory=dict)  # base model -> its profile
    model_objectives: Mapping[str, frozenset[str]] = field(default_factory=dict)  # base model -> allowed
    inference_objectives: Mapping[str, int] = field(default_factory=dict)  # resource name -> priority
    slos: Mapping[str, int] = field(default_factory=dict)  # profile -> its sloTtftMs, where set

    @classmethod
    def from_config(
        cls, config: GatewayConfig, inference_objectives: Mapping[str, int] | None = None
    ) -> HeaderPolicy:
        trust = config.listener.trust
        models = [m for pool in config.pools for m in pool.models]
        return cls(
            decision_header=trust.decision_header,
            internal=trust.internal,
            claim_value=trust.jwt_claim.value if trust.jwt_claim is not None else None,
            default_profile=config.default_profile,
            priorities={name: p.priority for name, p in config.scheduler_profiles().items()},
            model_profiles={m.name: m.profile for m in models if m.profile},
            model_objectives={m.name: frozenset(m.objectives) for m in models},
            inference_objectives=dict(inference_objectives or {}),
            slos={n: p.slo_ttft_ms for n, p in config.scheduler_profiles().items() if p.slo_ttft_ms},
        )

    def trusted(self, headers: Mapping[str, str]) -> bool:
        if self.internal:
            return True
        return self.claim_value is not None and headers.get(CLAIM_HEADER) == self.claim_value

    def slo_ttft_s(self, headers: Mapping[str, str], profile: str) -> float | None:
        """The request's time-to-first-token objective in seconds: a trusted caller's header,
        else its profile's `sloTtftMs`, else None. Raises ValueError on a trusted caller's
        header that is not a whole number of milliseconds in 1..600000."""
        asked = headers.get(SLO_TTFT_HEADER)
        if asked is not None and self.trusted(headers):
            if not asked.isdigit() or not 1 <= int(asked) <= 600_000:
                raise ValueError(f"{SLO_TTFT_HEADER} must be a whole number of milliseconds, 1 to 600000")
            return int(asked) / 1000.0
        own = self.slos.get(profile)
        return own / 1000.0 if own else None

    def slo_ignored(self, headers: Mapping[str, str]) -> bool:
        """The request asked for a latency objective it may not set (untrusted): said once in the
        EPP's log, so a client wondering why its header changed nothing can find out."""
        return SLO_TTFT_HEADER in headers and not self.trusted(headers)

    def explain(self, headers: Mapping[str, str]) -> bool:
        """Whether to return the per-pod scores on the response."""
        if headers.get(DECISION_HEADER) not in _ASKED:
            return False
        return self.decision_header or self.trusted(headers)

    def objective(self, headers: Mapping[str, str], base_model: str) -> Objective:
        own = self.model_profiles.get(base_model, self.default_profile)
        ceiling = self.priorities.get(own, 0)
        asked = headers.get(OBJECTIVE_HEADER)
        if asked is None:
            return Objective(own, ceiling)
        trusted = self.trusted(headers)
        profile, priority = own, ceiling
        if asked != own and asked in self.priorities:
            if trusted:
                profile, priority = asked, self.priorities[asked]
            elif asked in self.model_objectives.get(base_model, frozenset()):
                profile, priority = asked, min(self.priorities[asked], ceiling)
        declared = self.inference_objectives.get(asked)
        if declared is not None:
            priority = declared if trusted else min(declared, ceiling)
        return Objective(profile, priority)
