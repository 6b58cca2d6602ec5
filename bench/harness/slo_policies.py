"""Policies for the latency-objective benchmark (`--policy-module bench.harness.slo_policies`;
docs/benchmarks/slo.md).

- `epp-slo`: the shipped default profile with the listener trusting its callers
  (`listener.trust.internal`, as behind an internal API gateway), so each request's
  `x-gateway-slo-ttft-ms` is honoured (epp/scheduling/slo.py).
- `epp-default`, its twin without objectives: the same configuration, the header sent but
  ignored (an untrusted caller's, epp/requestcontrol/header_policy.py), so the comparison
  isolates the objective handling.

Both carry `CLASSES`, what the interactive-batch scenarios' batch class needs and any caller
may use: a `sheddable` profile (the default weights, priority -1) that the model lists among its
`objectives`, so an untrusted caller's `x-gateway-inference-objective: sheddable` is honoured
too (a request may always lower its own priority). Traffic that names no objective (slo_mix)
never reaches it: the slo-mixed-gpu and slo-uniform rows run the shipped default alone.
"""

from __future__ import annotations

from typing import Any

from bench.harness.gateway_policies import gateway_factory
from bench.harness.targets import register_policy
from devstack.launch import MODEL_DEFAULTS
from gateway.profiles import BUILTIN_PROFILE_DATA

CLASSES: dict[str, Any] = {
    "profiles": {"sheddable": {"weights": dict(BUILTIN_PROFILE_DATA["default"]["weights"]), "priority": -1}},
    MODEL_DEFAULTS: {"objectives": ["sheddable"]},
}
TRUSTED: dict[str, Any] = {**CLASSES, "listener": {"trust": {"internal": True}}}

# The same EPP configurations for `python -m bench sim --policy-module bench.harness.slo_policies`.
VIRTUAL_POLICIES = {"epp-slo": TRUSTED, "epp-default": CLASSES}

register_policy("epp-slo", gateway_factory("epp-slo", profile=None, config_extra=TRUSTED))
register_policy("epp-default", gateway_factory("epp-default", profile=None, config_extra=CLASSES))
