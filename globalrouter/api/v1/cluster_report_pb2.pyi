from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelReport(_message.Message):
    __slots__ = ("model", "ready_pods", "total_pods", "avg_kv_usage", "avg_queue", "running", "inflight_requests", "error_rate", "capacity", "ttft_s", "tpot_s")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    READY_PODS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PODS_FIELD_NUMBER: _ClassVar[int]
    AVG_KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    AVG_QUEUE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_S_FIELD_NUMBER: _ClassVar[int]
    model: str
    ready_pods: int
    total_pods: int
    avg_kv_usage: float
    avg_queue: float
    running: float
    inflight_requests: int
    error_rate: float
    capacity: int
    ttft_s: float
    tpot_s: float
    def __init__(self, model: _Optional[str] = ..., ready_pods: _Optional[int] = ..., total_pods: _Optional[int] = ..., avg_kv_usage: _Optional[float] = ..., avg_queue: _Optional[float] = ..., running: _Optional[float] = ..., inflight_requests: _Optional[int] = ..., error_rate: _Optional[float] = ..., capacity: _Optional[int] = ..., ttft_s: _Optional[float] = ..., tpot_s: _Optional[float] = ...) -> None: ...

class ClusterHeartbeat(_message.Message):
    __slots__ = ("cluster", "region", "cost_per_1k_tokens", "sequence", "sent_unix_ms", "draining", "models")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    COST_PER_1K_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    region: str
    cost_per_1k_tokens: float
    sequence: int
    sent_unix_ms: int
    draining: bool
    models: _containers.RepeatedCompositeFieldContainer[ModelReport]
    def __init__(self, cluster: _Optional[str] = ..., region: _Optional[str] = ..., cost_per_1k_tokens: _Optional[float] = ..., sequence: _Optional[int] = ..., sent_unix_ms: _Optional[int] = ..., draining: _Optional[bool] = ..., models: _Optional[_Iterable[_Union[ModelReport, _Mapping]]] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("sequence", "router_id", "known_cluster")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWN_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    router_id: str
    known_cluster: bool
    def __init__(self, sequence: _Optional[int] = ..., router_id: _Optional[str] = ..., known_cluster: _Optional[bool] = ...) -> None: ...
