"""The gateway's own HTTP header names: one definition for Envoy's rendering, BBR and the EPP.

Routing headers (`ROUTING_HEADERS`) are written by BBR/the EPP only; Envoy strips any a
client sends. The claim header is written by Envoy's `jwt_authn` after verifying a token.
"""

from __future__ import annotations

MODEL_HEADER = "x-gateway-model-name"  # BBR: the model whose pool routes the request
BASE_MODEL_HEADER = "x-gateway-base-model-name"  # BBR: an adapter's base model
DESTINATION_HEADER = "x-gateway-destination-endpoint"  # EPP: ip:port[,fallback...]
# EPP: the prefill pod of a disaggregated request, for the decode pod's sidecar (llm-d's names).
PREFILLER_HEADERS = ("x-prefiller-host-port", "x-prefiller-url")
ROUTING_HEADERS = frozenset({MODEL_HEADER, BASE_MODEL_HEADER, DESTINATION_HEADER, *PREFILLER_HEADERS})

CLAIM_HEADER = "x-gateway-trusted-claim"  # Envoy's jwt_authn only
TENANT_CLAIM_HEADER = "x-gateway-tenant-claim"  # Envoy's jwt_authn only: flowControl.tenantClaim
DECISION_HEADER = "x-gateway-decision"  # a trusted client asks for the EPP's scores
OBJECTIVE_HEADER = "x-gateway-inference-objective"  # a client names a scheduling profile
SLO_TTFT_HEADER = "x-gateway-slo-ttft-ms"  # a trusted client's time-to-first-token objective
# Protocol: the endpoint that actually served the request (after retries), which a gateway
# reports in `envoy.lb` metadata; the stream layer hands it to processors under this name.
SERVED_HEADER = "x-gateway-destination-endpoint-served"
