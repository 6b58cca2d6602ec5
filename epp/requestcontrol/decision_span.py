"""The decision as tracing span attributes (gateway/tracing.py): the chosen pod, its per-scorer
scores, the profile, how many candidates were ranked, the scheduling time, and the outcome.
Read only when tracing is on."""

from __future__ import annotations

from epp.scheduling.decision import Decision
from epp.scheduling.request import InferenceRequest
from extproc.errors import ErrorResponse
from extproc.headers import DESTINATION_HEADER
from extproc.stream import RequestRoute
from gateway.tracing import Attributes


def span_attributes(
    pool_name: str,
    request: InferenceRequest | None,
    decision: Decision | None,
    scheduling_s: float,
    outcome: RequestRoute | ErrorResponse,
) -> Attributes:
    attrs: dict[str, str | int | float] = {"gateway.pool": pool_name}
    if request is not None:
        attrs["gen_ai.request.model"] = request.model
        attrs["gateway.target_model"] = request.target_model
        attrs["gateway.request_id"] = request.request_id
        if request.adapter is not None:
            attrs["gateway.adapter"] = request.adapter
        if request.objective is not None:
            attrs["gateway.objective"] = request.objective
        attrs["gateway.scheduling_time_ms"] = round(scheduling_s * 1000, 4)
    if decision is not None:
        attrs["gateway.profile"] = decision.profile
        attrs["gateway.candidates"] = len(decision.ranked)
        if decision.reason:
            attrs["gateway.refusal_reason"] = decision.reason
    if isinstance(outcome, ErrorResponse):
        attrs["gateway.outcome"] = outcome.code
        attrs["http.response.status_code"] = outcome.status
        attrs.setdefault("gateway.refusal_reason", outcome.message)
        return attrs
    attrs["gateway.outcome"] = "routed"
    attrs["gateway.destination"] = outcome.set_headers[DESTINATION_HEADER]
    if decision is not None and decision.ranked:
        chosen = decision.ranked[0]
        attrs["gateway.endpoint"] = chosen
        for scorer, value in decision.scores.get(chosen, {}).items():
            attrs[f"gateway.score.{scorer}"] = round(value, 6)
    return attrs
