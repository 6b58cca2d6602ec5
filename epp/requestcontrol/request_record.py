"""A parsed body made this pool's request record: the seam between parsing (epp/requestcontrol/parse.py,
in this process or an ext_proc worker's) and scheduling, which receives the record and never
parses. The model is routed to this pool (or refused with 404), the objective, latency objective,
session key and agent program are read from the headers the trust policy allows
(epp/requestcontrol/header_policy.py, agent_session.py). Pure of the stream's state: the
processor keeps what it needs of the body for the response.
"""

from __future__ import annotations

import functools
import logging
import uuid

from epp.requestcontrol.agent_session import agent_program, session_key
from epp.requestcontrol.context import EppContext
from epp.requestcontrol.parse import ParsedBody
from epp.scheduling.request import InferenceRequest, RequestError, request_from_fields
from extproc.errors import ErrorResponse, bad_request
from extproc.headers import MODEL_HEADER, SLO_TTFT_HEADER
from gateway.config import ModelRoute

log = logging.getLogger(__name__)


@functools.cache
def _warn_slo_ignored() -> None:
    """Once per process: an untrusted request's latency objective header is ignored."""
    log.warning(
        "%s from an untrusted client ignored (its profile's sloTtftMs applies): only trusted requests "
        "may set it (listener.trust; docs/security.md 'Request headers'); said once",
        SLO_TTFT_HEADER,
    )


def route_here(ctx: EppContext, headers: dict[str, str], parsed: ParsedBody) -> ModelRoute | ErrorResponse:
    """The route of the body's model (else the model header's) when it is this pool's: a 404
    otherwise, unless the pool accepts any model (the reference EPP's contract: the route chose
    this pool; the pods validate the name)."""
    if parsed.error is not None:
        return parsed.error
    assert parsed.fields is not None
    model = parsed.fields.model or headers.get(MODEL_HEADER)
    if not isinstance(model, str):
        return bad_request("'model' must be a string", "invalid_model")
    config = ctx.config()
    route = config.routes().get(model)
    if route is not None and route.pool == ctx.pool_name:
        return route
    pool = config.pool(ctx.pool_name)
    if not pool.accept_any_model:
        return ErrorResponse(
            404, f"The model '{model}' is not served by pool '{ctx.pool_name}'", "model_not_found"
        )
    return ModelRoute(pool.name, pool.models[0].name, None)


def request_record(
    ctx: EppContext, headers: dict[str, str], parsed: ParsedBody, route: ModelRoute, model: str | None = None
) -> InferenceRequest | ErrorResponse:
    """The request the scheduler ranks for, routed as `route` (sent as `model` when a single-hop
    EPP rewrote it); a 400 for a malformed trusted objective header or request field."""
    if parsed.error is not None:
        return parsed.error
    assert parsed.fields is not None
    policy = ctx.header_policy
    objective = policy.objective(headers, route.base_model)  # epp/requestcontrol/header_policy.py
    try:
        slo_ttft_s = policy.slo_ttft_s(headers, objective.name)
    except ValueError as exc:
        return bad_request(str(exc), "invalid_slo")
    if policy.slo_ignored(headers):
        _warn_slo_ignored()
    try:
        return request_from_fields(
            parsed.fields,
            request_id=headers.get("x-request-id") or uuid.uuid4().hex,
            target_model=route.base_model,
            adapter=route.adapter,
            headers=headers,
            objective=objective.name,
            priority=objective.priority,
            # The configured header, else what coding agents send (agent_session.py).
            session_key=session_key(headers, ctx.config().session_affinity.header, parsed.fields.session_key),
            model=model,
            prefix=parsed.prefix,
            slo_ttft_s=slo_ttft_s,
            agent=agent_program(headers),
        )
    except RequestError as exc:
        return bad_request(str(exc))
