"""Render the Envoy bootstrap from the gateway configuration.

Built from envoy-data-plane's typed messages (gateway/envoy/blocks.py): a misspelt field or a
wrong type fails where the message is constructed (and under mypy), not when Envoy loads the
file. The result is serialised as proto-JSON (`envoy_blocks.plain`: Envoy's field names, proto
field order, default values left out), then parsed by `json_format.ParseDict` into the real
`Bootstrap` of xds-protos, the descriptors Envoy is built from; the integration tests run
`envoy --mode validate` on the result. The xDS server (gateway/envoy/xds_resources.py) sends the
very same messages as its resources. One source of truth (the gateway config) feeds the
services, this file and the xDS resources. The pieces: gateway/envoy/routes.py (routes, per-route
ext_proc settings), gateway/envoy/clusters.py (pool and ext_proc clusters),
gateway/envoy/topology.py (where things listen, shared names); this file assembles the listener,
its HTTP filters and the bootstrap.

Request path per pool (see README):
  strip client x-gateway-* headers -> BBR ext_proc (sets x-gateway-model-name) ->
  route on the model header -> that pool's EPP ext_proc (per-route override) ->
  the pool's cluster, which reads the destination from `envoy.lb` metadata only, so a
  client-sent destination header can never steer traffic.
Single-hop (`Topology.single_hop`, standalone Envoy only): strip -> one EPP ext_proc for every
pool, which sets the model headers and the destination in one reply -> the pool's cluster.

Pools with static endpoints use a STATIC cluster of exactly those pods with the OverrideHost
load-balancing policy: the metadata value is `primary` or `primary,fallback1,fallback2` (ip:port,
comma-separated, best first, IPv6 in brackets); each retry (connect failure, refused stream,
reset or 503 before the response started, `_retry_policy`) takes the next address of the list
(past it, least-request among the other members), within the cluster's retry budget, and only
cluster members can ever be chosen, so even a compromised EPP cannot send traffic outside the
pool. Kubernetes-discovered pools keep ORIGINAL_DST (their pods are not known at render time):
one address, no retry;
`Topology.original_dst_pools` renders a static pool that way too, so the local gateway and
its tests run the very cluster kind Kubernetes deployments use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envoy_data_plane.envoy.config.accesslog.v3 import AccessLogFilter, ExtensionFilter
from envoy_data_plane.envoy.config.cluster.v3 import (
    Cluster,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutation as RequestMutation
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutationRules
from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    HttpProtocolOptions,
)
from envoy_data_plane.envoy.config.listener.v3 import Listener
from envoy_data_plane.envoy.config.route.v3 import (
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.access_loggers.filters.cel.v3 import ExpressionFilter
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
)
from envoy_data_plane.envoy.extensions.filters.http.header_mutation.v3 import HeaderMutation, Mutations
from envoy_data_plane.envoy.extensions.filters.http.jwt_authn.v3 import (
    JwtAuthentication,
    JwtClaimToHeader,
    JwtProvider,
    JwtRequirement,
    RequirementRule,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpConnectionManagerCodecType,
    HttpFilter,
    LocalReplyConfig,
    ResponseMapper,
)
from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode

from extproc.errors import ANTHROPIC_PATHS, error_payload
from extproc.headers import (
    CLAIM_HEADER,
    DESTINATION_HEADER,
    MODEL_HEADER,
    PREFILLER_HEADERS,
    TENANT_CLAIM_HEADER,
)
from gateway.config import GatewayConfig
from gateway.envoy.blocks import (
    bootstrap,
    ext_processor,
    http_filter,
    pack,
    router_filter,
    seconds,
    topology_listener,
)
from gateway.envoy.clusters import ext_proc_clusters, pool_clusters, replica_retry_policy
from gateway.envoy.routes import gateway_routes, json_body, pool_processing_mode
from gateway.envoy.topology import (
    BBR_FILTER,
    EPP_FILTER,
    ERROR_DETAILS_PREFIX,
    SINGLE_HOP_CLUSTER,
    Topology,
)


def _ext_proc_filter(
    name: str, cluster: str, topo: Topology, *, response_headers: bool, buffered: bool, replicas: int = 1
) -> HttpFilter:
    config = ext_processor(
        cluster,
        topo.ext_proc_timeout_s,
        pool_processing_mode(response_headers=response_headers, buffered=buffered),
        retry_policy=replica_retry_policy(replicas),
    )
    config.status_on_error = HttpStatus(code=StatusCode.ServiceUnavailable)
    config.allow_mode_override = False
    config.mutation_rules = HeaderMutationRules(allow_all_routing=True)
    if name == EPP_FILTER:
        config.metadata_options = MetadataOptions(
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=["envoy.lb"])
        )
        # The endpoint that actually served (a retry may have moved it along the ranked list),
        # sent with the response headers: the EPP moves the in-flight slot there.
        config.response_attributes = ["upstream.address"]
    return http_filter(name, config)


# Envoy's own refusals by status: (OpenAI error type, stable code, message prefix).
_LOCAL_ERRORS: dict[int, tuple[str, str, str]] = {
    401: ("authentication_error", "invalid_api_key", "authentication failed"),
    403: ("permission_error", "forbidden", "forbidden"),
    413: ("invalid_request_error", "request_too_large", "request too large"),
    431: ("invalid_request_error", "request_header_fields_too_large", "request headers too large"),
}


def _mapper(expression: str, payload: dict[str, Any]) -> ResponseMapper:
    cel = ExtensionFilter(
        name="envoy.access_loggers.extension_filters.cel",
        typed_config=pack(ExpressionFilter(expression=expression)),
    )
    return ResponseMapper(
        filter=AccessLogFilter(extension_filter=cel), body_format_override=json_body(payload)
    )


def _local_reply_config() -> LocalReplyConfig:
    """Shape Envoy's own error replies (ext_proc down, upstream reset, no route, auth, limits)
    as JSON: Anthropic's error shape on its Messages API paths, OpenAI's elsewhere.

    Replies our services produced (details prefixed `gateway_`) and our direct responses are
    already JSON and pass through untouched.
    """
    ours = f"!response.code_details.startsWith('{ERROR_DETAILS_PREFIX}') && response.code_details != 'direct_response'"
    messages = "request.url_path in [" + ", ".join(f"'{p}'" for p in ANTHROPIC_PATHS) + "]"
    mappers: list[ResponseMapper] = []
    for anthropic, where in ((True, f"{ours} && {messages}"), (False, ours)):  # first match wins
        mappers += [
            _mapper(
                f"{where} && response.code == {status}",
                error_payload(
                    status,
                    f"{prefix}: %LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)",
                    code,
                    anthropic=anthropic,
                    error_type=error_type,
                ),
            )
            for status, (error_type, code, prefix) in _LOCAL_ERRORS.items()
        ]
        mappers.append(
            _mapper(
                where,
                error_payload(
                    500,
                    "the gateway could not complete the request (%RESPONSE_CODE_DETAILS%) %LOCAL_REPLY_BODY%",
                    "%RESPONSE_CODE_DETAILS%",
                    anthropic=anthropic,
                    error_type="server_error",
                ),
            )
        )
    return LocalReplyConfig(mappers=mappers)


def _jwt_filter(config: GatewayConfig) -> list[HttpFilter]:
    """Verify `Authorization: Bearer <JWT>` against the configured JWKS before anything else runs.

    The token is not forwarded upstream: model servers never see client credentials.
    """
    jwt = config.listener.jwt
    if jwt is None:
        return []
    provider = JwtProvider(
        issuer=jwt.issuer,
        audiences=list(jwt.audiences),
        local_jwks=DataSource(inline_string=jwt.jwks),
        forward=False,
    )
    claim = config.listener.trust.jwt_claim
    if claim is not None:  # the EPP trusts the request when this equals the configured value
        provider.claim_to_headers.append(JwtClaimToHeader(header_name=CLAIM_HEADER, claim_name=claim.name))
    tenant_claim = config.flow_control.tenant_claim
    if tenant_claim is not None:  # the EPP's fair-share tenant (epp/requestcontrol/flow_control.py)
        provider.claim_to_headers.append(
            JwtClaimToHeader(header_name=TENANT_CLAIM_HEADER, claim_name=tenant_claim)
        )
    authn = JwtAuthentication(
        providers={"gateway": provider},
        rules=[
            RequirementRule(match=RouteMatch(prefix="/"), requires=JwtRequirement(provider_name="gateway"))
        ],
    )
    return [http_filter("envoy.filters.http.jwt_authn", authn)]


def _strip_routing_headers() -> HttpFilter:
    """Client-sent routing and identity headers never reach the routing filters or a pod."""
    removed = (
        DESTINATION_HEADER,
        MODEL_HEADER,
        "x-gateway-base-model-name",
        CLAIM_HEADER,
        TENANT_CLAIM_HEADER,
        *PREFILLER_HEADERS,
    )
    mutations = Mutations(request_mutations=[RequestMutation(remove=h) for h in removed])
    return http_filter("gateway.strip_routing_headers", HeaderMutation(mutations=mutations))


def render_resources(config: GatewayConfig, topo: Topology) -> tuple[list[Listener], list[Cluster]]:
    """The listener (its route table inline) and the clusters: the static bootstrap's resources,
    and what the xDS server sends."""
    hcm = HttpConnectionManager(
        stat_prefix="gateway",
        codec_type=HttpConnectionManagerCodecType.AUTO,
        stream_idle_timeout=seconds(300),
        request_timeout=seconds(0),
        use_remote_address=True,
        # One spelling per path before the allow-list matches: `/v1/x/../../sleep` is `/sleep`.
        normalize_path=True,
        merge_slashes=True,
        max_request_headers_kb=config.listener.max_request_headers_kb,
        common_http_protocol_options=HttpProtocolOptions(max_headers_count=config.listener.max_headers_count),
        route_config=RouteConfiguration(
            name="gateway",
            virtual_hosts=[VirtualHost(name="all", domains=["*"], routes=gateway_routes(config, topo))],
        ),
        http_filters=[
            _strip_routing_headers(),
            *_jwt_filter(config),
            *_routing_filters(config, topo),
            router_filter(),
        ],
        local_reply_config=_local_reply_config(),
    )
    clusters = [*ext_proc_clusters(config, topo), *pool_clusters(config, topo)]
    listener = topology_listener(topo, hcm)
    if config.listener.max_buffered_body_bytes is not None:
        # Envoy's buffering filters answer 413 past this (shaped as JSON by `_local_reply_config`).
        listener.per_connection_buffer_limit_bytes = config.listener.max_buffered_body_bytes
    return [listener], clusters


def render_bootstrap(config: GatewayConfig, topo: Topology) -> dict[str, Any]:
    """The static bootstrap, as Envoy reads it (validated against the real protos)."""
    return bootstrap(topo.admin_port, *render_resources(config, topo))


def _routing_filters(config: GatewayConfig, topo: Topology) -> list[HttpFilter]:
    """Two-hop: BBR then the pool's EPP; single-hop: the one EPP, which does both. BBR and the
    single-hop EPP see every request, so they buffer bodies in `requestBodyMode: buffered`."""
    buffered = config.listener.request_body_mode == "buffered"
    if topo.single_hop:
        # Off the entry route (Envoy's own replies, direct responses) it must not hold the
        # response: the default skips response headers, `_single_hop_entry` asks for them.
        return [
            _ext_proc_filter(
                EPP_FILTER,
                SINGLE_HOP_CLUSTER,
                topo,
                response_headers=False,
                buffered=buffered,
                replicas=config.pools[0].epp.replicas,  # every pool names the same count
            )
        ]
    return [
        _ext_proc_filter(BBR_FILTER, "bbr", topo, response_headers=False, buffered=buffered),
        # Each pool route points this filter at its own EPP (ExtProcPerRoute). The per-route config is read when the filter runs, i.e. after
        # BBR has cleared the route cache, so it follows the model header.
        # Outside pool routes (e.g. Envoy's own reply to a malformed request, which has no
        # route) the EPP must not hold the response: the default skips response headers.
        _ext_proc_filter(
            EPP_FILTER,
            f"epp-{config.pools[0].name}",
            topo,
            response_headers=False,
            buffered=buffered,
            replicas=config.pools[0].epp.replicas,
        ),
    ]


def write_bootstrap(config: GatewayConfig, topo: Topology, path: Path) -> Path:
    path.write_text(json.dumps(render_bootstrap(config, topo), indent=1))
    return path
