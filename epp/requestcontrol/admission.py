"""Admission: what to do when the pool is saturated.

Sheddable traffic (priority < 0, e.g. the `batch` objective) gets 429 with Retry-After so
the client backs off and latency-sensitive traffic keeps the GPUs. Everything else is
still sent, to the best-ranked (least-loaded) pod: holding requests in the gateway would
only add a second queue in front of the model server's own, and vLLM's scheduler is better
placed to batch them.
"""

from __future__ import annotations

from epp.scheduling.decision import Decision
from epp.scheduling.request import InferenceRequest
from extproc.errors import ErrorResponse, rate_limited
from gateway.config import GatewayConfig


def admit(request: InferenceRequest, decision: Decision, config: GatewayConfig) -> ErrorResponse | None:
    if decision.saturated and request.priority < 0:
        return rate_limited(
            "the model pool is saturated; sheddable requests are refused until it recovers",
            config.admission.retry_after_s,
        )
    return None
