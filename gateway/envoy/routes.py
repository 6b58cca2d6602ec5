"""The gateway's Envoy routes: the API paths (OpenAI's and Anthropic's Messages API) to each
pool by its model header, with the ext_proc settings per route, the retry policy of a picked
pod, and JSON errors for what no route serves (404, 405).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    SubstitutionFormatString,
)
from envoy_data_plane.envoy.config.route.v3 import (
    DirectResponseAction,
    HeaderMatcher,
    RetryPolicy,
    RetryPolicyRetryHostPredicate,
    Route,
    RouteAction,
    RouteMatch,
)
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExtProcOverrides,
    ExtProcPerRoute,
    ProcessingMode,
)
from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import PreviousHostsPredicate
from envoy_data_plane.envoy.type.matcher.v3 import RegexMatcher, StringMatcher
from envoy_data_plane.google.protobuf import Struct

from extproc.errors import ANTHROPIC_PATHS, error_payload
from extproc.headers import (
    CLAIM_HEADER,
    DESTINATION_HEADER,
    MODEL_HEADER,
    TENANT_CLAIM_HEADER,
)
from gateway.config import MODELS_PATH, GatewayConfig
from gateway.envoy.blocks import (
    BodyMode,
    header,
    json_error_route,
    pack,
    processing_mode,
    seconds,
)
from gateway.envoy.clusters import override_host, replica_retry_policy
from gateway.envoy.topology import (
    BBR_FILTER,
    EPP_FILTER,
    RETRIABLE_STATUS_CODES,
    RETRIES,
    RETRY_ON,
    Topology,
)


def pool_processing_mode(
    *, response_headers: bool, buffered: bool = False, response_trailers: bool | None = None
) -> ProcessingMode:
    """FULL_DUPLEX_STREAMED (`listener.requestBodyMode: streamed`) or BUFFERED
    (`requestBodyMode: buffered`, and where FailOpen must work, since Envoy ignores
    `failure_mode_allow` for streamed bodies). Buffered bodies are bounded by the listener's
    per-connection buffer (`listener.maxBufferedBodyBytes`): past it Envoy answers 413 itself.

    `response_headers` (the EPP's accounting) also asks for response trailers: Envoy closes
    the ext_proc stream right after the response-headers reply when neither body nor trailers
    are wanted, and an SSE answer's headers come at once, so the in-flight slot would be freed
    at the first token. With trailers wanted, Envoy keeps the stream until the HTTP stream
    ends (last byte, reset or abort). Measured with Envoy 1.40: an HTTP/1.1 answer without
    trailers costs no extra message (none is synthesized), only the stream held open.

    `response_trailers` alone (True, with `response_headers` False) is what the EPP's ledger
    needs: the stream is still held to the response's end, and Envoy neither sends the response
    headers to the EPP nor holds them (and the first bytes behind them) for its reply. The pool
    routes ask for the headers too only where a feature reads them
    (`GatewayConfig.epp_reads_response_headers`).
    """
    return processing_mode(
        request_headers=True,
        request_body=BodyMode.BUFFERED if buffered else BodyMode.FULL_DUPLEX_STREAMED,
        request_trailers=not buffered,
        response_headers=response_headers,
        response_body=BodyMode.NONE,
        response_trailers=response_headers if response_trailers is None else response_trailers,
    )


def _invalid_request(
    name: str, status: int, message: str, code: str, match: RouteMatch, *, anthropic: bool = False
) -> Route:
    return json_error_route(name, match, status, message, "invalid_request_error", code, anthropic=anthropic)


def _models_list(config: GatewayConfig) -> str:
    data = [
        {"id": name, "object": "model", "owned_by": "inference-gateway", "root": route.base_model}
        for name, route in sorted(config.routes().items())
    ]
    return json.dumps({"object": "list", "data": data})


def _pool_paths(config: GatewayConfig) -> list[str] | None:
    """The paths routed to pools: None for every path (`allowAllPaths`); `/v1/models` never,
    since Envoy answers it from the configuration."""
    if config.listener.allow_all_paths:
        return None
    return [p for p in config.listener.paths if p != MODELS_PATH]


def _path_match(paths: list[str] | None) -> RouteMatch:
    """Any path, or exactly the given ones (Envoy matches the path without its query string)."""
    if paths is None:
        return RouteMatch(prefix="/")
    return RouteMatch(safe_regex=RegexMatcher(regex="|".join(_regex_escape(p) for p in paths)))


def _served_routes(config: GatewayConfig, topo: Topology) -> list[Route]:
    """Everything after `/v1/models`: the pools, then Envoy's own JSON errors.

    With the allow-list (the default) a path outside it, or a method other than POST on an
    inference path, never reaches BBR, an EPP or a pod: the routes answering them have BBR
    disabled here and the EPP disabled on every direct response.
    """
    paths = _pool_paths(config)
    if paths is None:  # allowAllPaths: any path and method goes to the pools
        return [*_pool_routes(config, topo, _path_match(None)), *_no_routes(None)]
    routes: list[Route] = []
    if paths:
        routes += _pool_routes(config, topo, _with_headers(_path_match(paths), _method("POST")))
        routes += _no_routes(paths, _method("POST"))
        messages = _messages_paths(paths)
        if messages:  # Anthropic's paths answer in Anthropic's error shape
            refusal = _method_not_allowed("messages-method-not-allowed", _path_match(messages), "POST", True)
            routes.append(_without_bbr(refusal, topo))
        routes.append(
            _without_bbr(_method_not_allowed("method-not-allowed", _path_match(paths), "POST"), topo)
        )
    not_served = _invalid_request(
        "path-not-served",
        404,
        f"this gateway serves only these paths: {', '.join(config.listener.paths)}",
        "not_found",
        RouteMatch(prefix="/"),
    )
    return [*routes, _without_bbr(not_served, topo)]


def _method(name: str) -> HeaderMatcher:
    return HeaderMatcher(name=":method", string_match=StringMatcher(exact=name))


def _present(name: str) -> HeaderMatcher:
    return HeaderMatcher(name=name, present_match=True)


def _with_headers(match: RouteMatch, *headers: HeaderMatcher) -> RouteMatch:
    """`match` narrowed by more header matchers (all must hold)."""
    return dataclasses.replace(match, headers=[*match.headers, *headers])


def _disabled() -> ExtProcPerRoute:
    return ExtProcPerRoute(disabled=True)


def _without_bbr(route: Route, topo: Topology) -> Route:
    """A route Envoy answers from the request line alone: BBR need not read the body."""
    if not topo.single_hop:
        route.typed_per_filter_config[BBR_FILTER] = pack(_disabled())
    return route


def _method_not_allowed(name: str, match: RouteMatch, allowed: str, anthropic: bool = False) -> Route:
    """A served path with another method: a JSON 405 naming the one it takes (`allow`, RFC 9110)."""
    message = f"this path takes {allowed} only"
    route = _invalid_request(name, 405, message, "method_not_allowed", match, anthropic=anthropic)
    route.response_headers_to_add.append(header("allow", allowed))
    return route


def _messages_paths(paths: list[str] | None) -> list[str]:
    """Anthropic's Messages API paths among the served ones (all of them with `allowAllPaths`)."""
    return [p for p in ANTHROPIC_PATHS if paths is None or p in paths]


def _no_routes(paths: list[str] | None, *headers: HeaderMatcher) -> list[Route]:
    """`_no_route` for the served paths (requests carrying `headers`), Anthropic's paths first
    with its error shape."""
    routes: list[Route] = []
    messages = _messages_paths(paths)
    if messages:
        routes += _no_route(_with_headers(_path_match(messages), *headers), anthropic=True)
    return routes + _no_route(_with_headers(_path_match(paths), *headers))


def _no_route(match: RouteMatch, *, anthropic: bool = False) -> list[Route]:
    """After BBR (or the single-hop EPP) routed, no pool route took the request.

    With a model header, the model is one Envoy's routes do not know (yet: the services
    checked it against a configuration Envoy has not received): a 404 `model_not_found` naming
    it. Envoy substitutes the name into a JSON body, so it is escaped, never spliced. Without
    one (an empty body: nothing reached BBR to route on) the request named no model at all: a
    400 `model_required`, as BBR answers a body of `{}`. `anthropic`: the routes of
    Anthropic's paths (named `no-route-messages...`), in its error shape.
    """
    name = "no-route-messages" if anthropic else "no-route"
    message = f"The model '%REQ({MODEL_HEADER})%' has no route in this gateway"
    error = error_payload(404, message, "model_not_found", anthropic=anthropic, error_type="not_found_error")
    unknown_model = Route(
        name=f"{name}-model",
        match=_with_headers(match, _present(MODEL_HEADER)),
        direct_response=DirectResponseAction(status=404, body_format=json_body(error)),
    )
    api = "an Anthropic Messages API" if anthropic else "an OpenAI-compatible"
    no_model = (
        f"no 'model' to route on (the body was empty): send {api} JSON request body with a 'model' field"
    )
    return [
        unknown_model,
        # A 400 as for a body of `{}` or whitespace: the request, not the path, is what is wrong.
        _invalid_request(name, 400, no_model, "model_required", match, anthropic=anthropic),
    ]


def json_body(payload: dict[str, Any]) -> SubstitutionFormatString:
    """A JSON error body with Envoy's substitutions (%REQ(...)%, ...) in its strings."""
    return SubstitutionFormatString(json_format=Struct.from_dict(payload), content_type="application/json")


def _pool_routes(config: GatewayConfig, topo: Topology, path: RouteMatch) -> list[Route]:
    """Two routes per pool (one in single-hop), matching `path` (paths and method) and the model."""
    routes: list[Route] = []
    for pool in config.pools:
        names = [m.name for m in pool.models] + [a for m in pool.models for a in m.adapters]
        model_match = HeaderMatcher(
            name=MODEL_HEADER,
            string_match=StringMatcher(
                safe_regex=RegexMatcher(regex="|".join(_regex_escape(n) for n in names))
            ),
        )
        # 1) After the EPP chose: route by `envoy.lb` metadata to the chosen pod.
        picked = RouteAction(cluster=f"pool-{pool.name}", timeout=seconds(0), idle_timeout=seconds(300))
        if override_host(pool, topo):
            picked.retry_policy = _retry_policy()
        routes.append(
            Route(
                name=f"{pool.name}-picked",
                match=_with_headers(path, model_match, _present(DESTINATION_HEADER)),
                route=picked,
                request_headers_to_remove=[
                    CLAIM_HEADER,
                    TENANT_CLAIM_HEADER,
                ],  # the pod needs no client identity
            )
        )
        if topo.single_hop:  # the one EPP already chose, on the entry route (`_single_hop_entry`)
            continue
        # 2) Before the EPP chose: run this pool's EPP. If it fails open, the fallback cluster serves.
        epp_override = ExtProcPerRoute(
            overrides=ExtProcOverrides(
                grpc_service=GrpcService(
                    envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=f"epp-{pool.name}"),
                    timeout=seconds(topo.ext_proc_timeout_s),
                    retry_policy=replica_retry_policy(pool.epp.replicas),
                ),
                failure_mode_allow=pool.failure_mode == "FailOpen",
                # Response headers + trailers: the EPP holds the request's in-flight slot until
                # the response ends; only pool routes ask for them.
                processing_mode=pool_processing_mode(
                    response_headers=config.epp_reads_response_headers(pool),
                    response_trailers=True,
                    buffered=config.buffers_request_bodies(pool),
                ),
            )
        )
        # Only a FailOpen pool's request that its EPP could not route ever reaches this cluster
        # (otherwise the EPP's reply re-routes it to `-picked`, or fails closed): plain balancing
        # over the pool, where a failed pod is retried on another one, as on the picked route.
        fail_open = pool.failure_mode == "FailOpen"
        pick = RouteAction(
            cluster=f"fallback-{pool.name}" if fail_open else f"pool-{pool.name}",
            timeout=seconds(0),
            idle_timeout=seconds(300),
        )
        if fail_open:
            pick.retry_policy = _retry_policy()
        routes.append(
            Route(
                name=f"{pool.name}-pick",
                match=_with_headers(path, model_match),
                route=pick,
                request_headers_to_remove=[CLAIM_HEADER, TENANT_CLAIM_HEADER],
                typed_per_filter_config={EPP_FILTER: pack(epp_override)},
            )
        )
    return routes


def _single_hop_entry(route: Route, *, buffered: bool, response_headers: bool) -> None:
    """Single-hop: the routes a request can match before the EPP answers, i.e. where the one EPP
    filter reads its per-route settings (Envoy reads them once, before the EPP's reply clears
    the route cache). That is `no-route` (no model header yet; when the EPP lets a request
    through without a model, no body, this very route answers Envoy's JSON 404), and the pools'
    `-picked` routes, which a client forging the routing headers matches until they are
    stripped. They ask for response trailers (and headers where a feature reads them), as a pool
    route does in two-hop mode, so the EPP holds the in-flight slot until the response ends."""
    mode = pool_processing_mode(response_headers=response_headers, response_trailers=True, buffered=buffered)
    route.typed_per_filter_config = {
        EPP_FILTER: pack(ExtProcPerRoute(overrides=ExtProcOverrides(processing_mode=mode)))
    }


def _retry_policy() -> RetryPolicy:
    """Failures before the response started, on the next pod of the EPP's list: Envoy retries
    only until it forwards response headers, so a client never sees two answers, and only while
    the request body still fits its retry buffer (the listener's per-connection buffer)."""
    return RetryPolicy(
        retry_on=RETRY_ON,
        retriable_status_codes=list(RETRIABLE_STATUS_CODES),
        num_retries=RETRIES,
        retry_host_predicate=[
            RetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts", typed_config=pack(PreviousHostsPredicate())
            )
        ],
        host_selection_retry_max_attempts=3,
    )


def _regex_escape(name: str) -> str:
    return re.escape(name)


def gateway_routes(config: GatewayConfig, topo: Topology) -> list[Route]:
    routes: list[Route] = []
    if config.listener.allow_all_paths or MODELS_PATH in config.listener.paths:
        routes.append(
            Route(
                name="models-list",
                match=RouteMatch(path=MODELS_PATH, headers=[_method("GET")]),
                direct_response=DirectResponseAction(
                    status=200, body=DataSource(inline_string=_models_list(config))
                ),
                response_headers_to_add=[header("content-type", "application/json")],
            )
        )
        if not config.listener.allow_all_paths:
            routes.append(
                _without_bbr(_method_not_allowed("models-method", RouteMatch(path=MODELS_PATH), "GET"), topo)
            )
    routes.extend(_served_routes(config, topo))
    if topo.single_hop:
        for route in routes:
            if route.name.startswith("no-route") or route.name.endswith("-picked"):
                # Single-hop has no FailOpen pools (`_single_hop_check`): the listener's mode.
                _single_hop_entry(
                    route,
                    buffered=config.listener.request_body_mode == "buffered",
                    response_headers=config.epp_reads_response_headers(),
                )
    # Requests that reach no pool never talk to an EPP. This matters for Envoy's own replies to
    # malformed requests (headers too large -> 431): the EPP filter would hold the reply's headers
    # for an ext_proc round trip while the codec closes the connection, and the client would get
    # an empty reply instead of the JSON 431.
    for route in routes:
        if route.direct_response is not None and EPP_FILTER not in route.typed_per_filter_config:
            route.typed_per_filter_config[EPP_FILTER] = pack(_disabled())
    return routes
