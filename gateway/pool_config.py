"""One pool's section of the gateway configuration (`pools[]`): its models, endpoints or
Kubernetes discovery, its EPP's address, replicas and workers, KV events, disaggregation and
scale from zero. Part of the one schema every service validates with (gateway/config.py).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

# Metric dialects (epp/datalayer/metric_dialects.py DIALECTS; a test keeps the two in step).
Engine = Literal["vllm", "sglang", "tgi", "trtllm", "llamacpp"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Rewrite(StrictModel):
    """One arm of a weighted traffic split: send `weight` parts of the traffic to `model`."""

    model: str = Field(min_length=1)
    weight: int = Field(ge=0)


class ModelConfig(StrictModel):
    name: str = Field(min_length=1)
    adapters: list[str] = Field(default_factory=list)
    profile: str | None = None  # scheduling profile used when the request names none
    # Profiles any client may pick with `x-gateway-inference-objective` (never above `profile`'s
    # priority); only trusted requests (listener.trust) may name any other.
    objectives: list[str] = Field(default_factory=list)
    rewrites: list[Rewrite] = Field(default_factory=list)
    # The model's tokenizer folder on the EPP's disk (Hugging Face layout: tokenizer.json,
    # tokenizer_config.json with chat_template): the EPP computes the tokens the engine sees
    # and scores pods by the precise KV index (epp/datalayer/tokenizer.py). A folder that does not load
    # is logged and the model falls back to approximate prefix scoring (/debug/pool says so).
    tokenizer: str | None = Field(default=None, min_length=1, max_length=4096)


def validate_ip_port(v: str) -> str:
    """`ip:port` (IPv6 in brackets): Envoy connects to endpoints by address, never by name."""
    host, sep, port = v.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("must be ip:port")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError as exc:
        raise ValueError("host must be an IP address") from exc
    return v


Port = Annotated[int, Field(ge=1, lt=65536)]


KvCapacity = Annotated[int, Field(ge=1, le=1_000_000_000)]


class EndpointConfig(StrictModel):
    """A statically configured model-server pod."""

    address: str
    # Its name, shown beside the address in the decision header and /debug/pool.
    name: str | None = Field(default=None, min_length=1, max_length=253)
    models: list[str] | None = None  # defaults to every model of the pool
    adapters: list[str] | None = None  # defaults to every adapter of those models
    engine: Engine | None = None  # defaults to the pool's engine
    # This pod's vLLM KV-event PUB / replay ports, over the pool's kvEvents ports.
    kv_events_port: Port | None = Field(default=None, alias="kvEventsPort")
    kv_replay_port: Port | None = Field(default=None, alias="kvReplayPort")
    # KV capacity in tokens, over the pool's (TGI reports tokens held, not a fraction).
    kv_capacity_tokens: KvCapacity | None = Field(default=None, alias="kvCapacityTokens")
    # vLLM's --data-parallel-size behind this address: the EPP pins a rank (epp/requestcontrol/dp_ranks.py).
    data_parallel_size: int = Field(default=1, ge=1, le=64, alias="dataParallelSize")
    # The pod's labels, as Kubernetes discovery reads them (e.g. llm-d.ai/role: prefill).
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("address")
    @classmethod
    def _host_port(cls, v: str) -> str:
        return validate_ip_port(v)


class DisaggregationConfig(StrictModel):
    """Prefill/decode disaggregation (epp/scheduling/disaggregation.py): every request gets a decode pod;
    one whose prompt part not already cached on that pod is at least `minUncachedTokens` also
    gets a prefill pod, unless the best prefill pod's queue is over `maxPrefillQueue`. The
    prefill pod travels in `prefillerHeader` to the decode pod's sidecar (pdsidecar/)."""

    role_label: str = Field(default="llm-d.ai/role", alias="roleLabel", min_length=1)
    min_uncached_tokens: int = Field(default=1024, ge=1, alias="minUncachedTokens")
    max_prefill_queue: float = Field(default=4.0, ge=0.0, alias="maxPrefillQueue")
    prefiller_header: Literal["x-prefiller-host-port", "x-prefiller-url"] = Field(
        default="x-prefiller-host-port", alias="prefillerHeader"
    )


class KubernetesDiscovery(StrictModel):
    namespace: str = "default"
    pool_name: str = Field(alias="poolName", min_length=1)


class KvEventsConfig(StrictModel):
    """Subscribe to every pod's vLLM KV-cache events (`--kv-events-config`, zmq publisher):
    `port` is the PUB port (vLLM's `endpoint`), `replayPort` its `replay_endpoint` port."""

    port: Port | None = None  # None: only pods that name their own port (annotation, endpoint)
    replay_port: Port | None = Field(default=None, alias="replayPort")
    # Bound of the precise index: (pod, block) entries kept, least recently stored dropped.
    max_blocks: int = Field(default=1_000_000, ge=1, le=100_000_000, alias="maxBlocks")


MAX_EPP_REPLICAS = 32


MAX_EPP_WORKERS = 256


class EppAddress(StrictModel):
    """Where Envoy reaches the pool's EPP. `replicas` > 1: several active-active EPP processes
    (share their in-flight counts with `sharedState`). With an IP `host` they listen on
    `port`, `port + 1`, ... (one Envoy endpoint each); with a DNS name, the name must resolve
    to every replica (a headless Service) and Envoy balances over what it resolves.

    `workers`: the ext_proc worker processes of each EPP (epp/workers/processes.py): N > 1 spreads the
    gRPC stream work over N processes that all listen on `port` and ask the EPP's one
    scheduling process for each decision; "auto" = the CPUs the EPP may use (affinity and
    cgroup quota); 1 = one process, no workers. Read at start (`python -m epp --workers`
    overrides it)."""

    host: str = "127.0.0.1"
    port: int = Field(default=9002, ge=0, lt=65536)
    replicas: int = Field(default=1, ge=1, le=MAX_EPP_REPLICAS)
    workers: int | Literal["auto"] = Field(default=1)

    @field_validator("workers")
    @classmethod
    def _workers_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_EPP_WORKERS:
            raise ValueError(f'workers must be 1 to {MAX_EPP_WORKERS} or "auto", not {value}')
        return value

    @model_validator(mode="after")
    def _replica_ports(self) -> EppAddress:
        if self.replicas > 1 and self.port + self.replicas - 1 >= 65536:
            raise ValueError(f"port {self.port} + {self.replicas} replicas runs past 65535")
        return self

    def addresses(self) -> list[tuple[str, int]]:
        return replica_addresses(self.host, self.port, self.replicas)


def replica_addresses(host: str, port: int, replicas: int) -> list[tuple[str, int]]:
    """The (host, port) of each EPP replica as Envoy's cluster lists them: consecutive ports on
    an IP; a DNS name once (it resolves to every replica)."""
    if replicas == 1 or not is_ip(host):
        return [(host, port)]
    return [(host, port + i) for i in range(replicas)]


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


# Envoy's ext_proc message timeout (gateway/envoy/bootstrap.py, 10 s) bounds how long the EPP may
# hold a request before answering it: a longer wait would end in Envoy's 503, not our 429.
MAX_FLOW_WAIT_MS = 9_000


class ScaleFromZeroConfig(StrictModel):
    """A pool scaled to zero (or whose pods are all starting) holds new requests up to
    `maxWaitMs` for its first ready pod, then answers 503 with Retry-After. Bounded by Envoy's
    ext_proc message timeout like flow control's waits (`MAX_FLOW_WAIT_MS`)."""

    max_wait_ms: int = Field(default=5_000, ge=1, le=MAX_FLOW_WAIT_MS, alias="maxWaitMs")


class PoolConfig(StrictModel):
    name: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    models: list[ModelConfig] = Field(min_length=1)
    engine: Engine = "vllm"
    target_port: int = Field(default=8000, alias="targetPort", ge=1, lt=65536)
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    kubernetes: KubernetesDiscovery | None = None
    failure_mode: Literal["FailClose", "FailOpen"] = Field(default="FailClose", alias="failureMode")
    epp: EppAddress = Field(default_factory=EppAddress)
    # Extra endpoints, ranked after the chosen one, that Envoy retries on in that order (static
    # pools; 0: a retry takes Envoy's least-request pick among the others). > 0 also sends the
    # EPP the response headers, to move the accounting with the retry (docs/scheduling.md,
    # "Retries"). Kubernetes pools (ORIGINAL_DST, one address): must be 0.
    fallback_endpoints: int = Field(default=0, ge=0, le=8, alias="fallbackEndpoints")
    kv_events: KvEventsConfig | None = Field(default=None, alias="kvEvents")
    # KV-cache capacity of each pod in tokens (e.g. TGI's --max-total-tokens): TGI publishes the
    # tokens its batch holds, not a fraction, so without it a TGI pod's KV usage is unknown.
    kv_capacity_tokens: KvCapacity | None = Field(default=None, alias="kvCapacityTokens")
    # The reference EPP's behaviour: any `model` the route sends here is scheduled on this
    # pool's first model (the HTTPRoute, not the model list, decides what reaches the pool).
    accept_any_model: bool = Field(default=False, alias="acceptAnyModel")
    disaggregation: DisaggregationConfig | None = None  # prefill/decode split; None: aggregated
    # Hold requests while no pod is ready (epp/requestcontrol/scale_from_zero.py); None: 503 at once.
    scale_from_zero: ScaleFromZeroConfig | None = Field(default=None, alias="scaleFromZero")
