"""Policies for the latency-objective benchmark (`--policy-module bench.harness.slo_policies`;
docs/benchmarks/slo.md).

- `epp-slo`: the shipped default profile with the listener trusting its callers
  (`listener.trust.internal`, as behind an internal API gateway), so each request's
  `x-gateway-slo-ttft-ms` is honoured (epp/scheduling/slo.py).
- Its twin without objectives is `epp-default` itself: the same profile, the header sent but
  ignored (an untrusted caller's, epp/requestcontrol/header_policy.py), so the comparison isolates the objective
  handling. Nothing else differs: the slo_mix workload sends no other gateway header.
"""

from __future__ import annotations

from typing import Any

from bench.harness.gateway_policies import gateway_factory
from bench.harness.targets import register_policy

TRUSTED: dict[str, Any] = {"listener": {"trust": {"internal": True}}}

# The same EPP configuration for `python -m bench sim --policy-module bench.harness.slo_policies`.
VIRTUAL_POLICIES = {"epp-slo": TRUSTED}

register_policy("epp-slo", gateway_factory("epp-slo", profile=None, config_extra=TRUSTED))
