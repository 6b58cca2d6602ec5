"""The immutable records of a pool that scheduling reads: `Endpoint`, `Metrics`, `EndpointState`,
`PoolSnapshot` (`Pool` in epp/datalayer/pool.py, the one mutable owner, makes them).

The records are also the one place where values are made sane: `Metrics` and
`EndpointState` drop non-finite, negative and absurd values on construction (a dropped
field reads as unknown, `None`, never as a confident zero), so every scorer, filter and
picker can rely on finite, non-negative inputs whoever built the snapshot. The parser
(epp/datalayer/metric_dialects.py) applies the same rules first to count and log what it rejects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

# Sanity limits for scraped values (see `count_problem` and friends).
MAX_COUNT = 1e12  # queue lengths, token counts, label integers: more is a broken exporter
KV_TOLERANCE = 0.01  # KV fractions a hair outside [0, 1] (float rounding) are clamped, not rejected
MAX_SPEED_S = 3600.0  # a TTFT or time per token over an hour is not a measurement
MIN_PREFILL_TPS = 1e-3  # a prefill pace under a token per 1,000 s is not a measurement either
# vLLM keeps this fraction of KV blocks free when it admits a waiting request (its scheduler's
# watermark), so that much of the scraped free KV is not room for new requests.
KV_ADMIT_WATERMARK = 0.01


def count_problem(value: float) -> str | None:
    """Why `value` is not a usable count or gauge (None when it is)."""
    if isinstance(value, int):  # exact, and no float conversion that could overflow
        return "negative" if value < 0 else "too_large" if value > MAX_COUNT else None
    if not math.isfinite(value):
        return "non_finite"
    if value < 0.0:
        return "negative"
    if value > MAX_COUNT:
        return "too_large"
    return None


def fraction_problem(value: float) -> str | None:
    """Why `value` is not a usable 0..1 fraction (None when it is, within KV_TOLERANCE)."""
    if isinstance(value, int):
        return None if 0 <= value <= 1 else "out_of_range"
    if not math.isfinite(value):
        return "non_finite"
    if not -KV_TOLERANCE <= value <= 1.0 + KV_TOLERANCE:
        return "out_of_range"
    return None


def integer_problem(value: float) -> str | None:
    """Why `value` is not a usable non-negative integer (None when it is)."""
    problem = count_problem(value)
    if problem is None and value != int(value):
        return "not_an_integer"
    return problem


def usable_speed(value: float | None) -> float | None:
    """A speed observation in seconds: > 0 and <= MAX_SPEED_S, else unknown."""
    return value if value is not None and 0.0 < value <= MAX_SPEED_S else None


def _set(record: object, name: str, value: object) -> None:
    object.__setattr__(record, name, value)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model-server pod as discovery sees it."""

    address: str  # "ip:port", exactly what goes into x-gateway-destination-endpoint
    models: frozenset[str]  # base models served
    adapters: frozenset[str] = frozenset()  # LoRA adapters it can load
    engine: str = "vllm"  # metric dialect: vllm | sglang | tgi | trtllm | llamacpp
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_url: str | None = None  # defaults to http://{address}/metrics
    kv_events_port: int | None = None  # vLLM KV-event PUB port (over the pool's kvEvents.port)
    kv_replay_port: int | None = None
    # KV-cache capacity in tokens, for engines that report tokens held rather than a fraction (TGI).
    kv_capacity_tokens: int | None = None
    # The pod's name as discovery knows it (the static list's `name`, the Kubernetes pod's):
    # what the decision header and /debug/pool show beside the address. None: unnamed.
    name: str | None = None
    # vLLM's --data-parallel-size: engines behind this one address (epp/requestcontrol/dp_ranks.py pins one).
    data_parallel_size: int = 1

    def serves(self, model: str, adapter: str | None) -> bool:
        if model not in self.models:
            return False
        return adapter is None or not self.adapters or adapter in self.adapters


@dataclass(frozen=True, slots=True)
class Metrics:
    """What one scrape of a pod says, normalised across engine dialects.

    `None` = unknown (not on the page, or rejected by the parser); scorers treat it as the
    worst case for that field, never as idle. Built in code, the defaults are known zeros.
    """

    waiting: float | None = 0.0
    running: float | None = 0.0
    kv_usage: float | None = 0.0  # 0..1
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    max_lora: int = 0  # 0 = not reported
    block_size: int | None = None  # tokens per KV block, when the server reports it
    num_gpu_blocks: int | None = None
    scraped_at: float = 0.0  # the pool's clock (time.monotonic() live) at the scrape

    def __post_init__(self) -> None:
        if self.waiting is not None and count_problem(self.waiting):
            _set(self, "waiting", None)
        if self.running is not None and count_problem(self.running):
            _set(self, "running", None)
        kv = self.kv_usage
        if kv is not None:
            _set(self, "kv_usage", None if fraction_problem(kv) else min(1.0, max(0.0, kv)))
        if integer_problem(self.max_lora):
            _set(self, "max_lora", 0)
        if self.block_size is not None and (integer_problem(self.block_size) or self.block_size == 0):
            _set(self, "block_size", None)
        if self.num_gpu_blocks is not None and integer_problem(self.num_gpu_blocks):
            _set(self, "num_gpu_blocks", None)
        if not math.isfinite(self.scraped_at):
            _set(self, "scraped_at", 0.0)  # "long ago": the metrics read as stale, not fresh


def kv_room(metrics: Metrics, inflight_requests: int, inflight_tokens: int) -> float:
    """How many more requests the pod's free KV cache holds: the free blocks of the last
    scrape (less vLLM's admission watermark) over the mean estimated size (prompt + expected
    output tokens) of the requests in flight to it. 0 when any term is unknown (then every
    queued or unseen request counts as a backlog, the conservative reading)."""
    kv, blocks, block_size = metrics.kv_usage, metrics.num_gpu_blocks, metrics.block_size
    if kv is None or not blocks or block_size is None or inflight_requests <= 0 or inflight_tokens <= 0:
        return 0.0
    try:  # a hostile page can report block counts no float holds: then no room is known
        room = (
            (1.0 - KV_ADMIT_WATERMARK - kv)
            * float(blocks)
            * float(block_size)
            * inflight_requests
            / inflight_tokens
        )
    except OverflowError:
        return 0.0
    if not room > 0.0 or not math.isfinite(room):
        return 0.0
    return float(math.floor(room))


@dataclass(slots=True)
class EndpointState:
    """One pod as the scheduler sees it at one instant: read-only by contract (scorers and
    filters never write it). Not `frozen`: a frozen dataclass sets each of these 20 fields
    through `object.__setattr__`, and the pool builds one per pod per decision (frozen, a
    100-pod snapshot cost 0.97 ms; plain slots 0.58 ms, the same decisions)."""

    endpoint: Endpoint
    metrics: Metrics | None  # None until the first successful scrape
    metrics_age: float  # seconds since the last successful scrape (inf if never)
    # Routed and not finished: by this EPP, plus what the pool's other replicas publish
    # (epp/datalayer/shared_state.py) when replicas share state.
    inflight_requests: int = 0
    inflight_tokens: int = 0  # their estimated prompt+output tokens
    ttft_ewma: float | None = None  # smoothed observed time to first byte, seconds
    tpot_ewma: float | None = None  # smoothed observed time per output token, seconds
    # Learned from the server's per-request histograms (epp/datalayer/prefill_pace.py), smoothed like the speeds:
    prefill_tps: float | None = None  # prompt tokens it prefills per second (recent best)
    uncached_fraction: float | None = None  # share of a typical prompt not in its prefix cache
    mean_prompt_tokens: float | None = None  # a typical prompt's length on this pod
    healthy: bool = True  # False after repeated scrape failures
    # The effective queue, computed here once for every scorer and filter that reads it:
    # scraped waiting (less what finishes since admitted) + requests routed here that the
    # scrape does not show yet: at least this EPP's requests routed since the scrape and
    # still in flight, and at least in-flight - waiting - running (requests in transit when
    # the scrape was read; other replicas' requests only ever make the pod's counts larger,
    # so this never double counts). None while waiting is unknown.
    queue: float | None = field(init=False, default=None)
    # The part of `queue` the pod cannot start now, what saturation reads: the scraped
    # waiting count (the engine did not admit those: KV full, its sequence limit, or a step in
    # progress) plus the unseen requests beyond how many of this EPP's mean in-flight size fit
    # in the KV cache the last scrape showed free (`kv_room`). A request routed since the
    # scrape to a pod with free KV starts at the pod's next engine step; counted as queued,
    # one such request made a half-empty pod read as saturated. None with `queue`.
    backlog: float | None = field(init=False, default=None)
    # Requests of this EPP that finished on the pod since its last scrape: each let the engine
    # admit one waiting request, so the scraped waiting count is that much too high by now.
    finished_since_scrape: int = 0
    # Requests this EPP routed to the pod since its last scrape and still in flight: none is in
    # the scraped counts, each still needs its prefill. Netting them against finished ones
    # (in-flight - waiting - running alone) read a pod that finished as many as it was sent
    # as having nothing pending, and a burst clumped onto it between two scrapes.
    routed_since_scrape: int = 0
    # From the pod's ledger (epp/datalayer/ledger.py), when the pool keeps one (None: a record built without
    # it, e.g. in code, reads the scrape-and-counts formula above): this EPP's picks whose prefill
    # has not ended, the seconds until their projected prefills end, the page's waiting requests
    # that are not this EPP's, and the KV tokens this EPP committed since the page.
    pending_requests: int | None = None
    unseen_pending: int = 0  # of those, routed since the page (the rest the page shows waiting)
    stuck_requests: int = 0  # of those, with no projected end (the page shows them waiting)
    busy_s: float = 0.0
    foreign_waiting: float = 0.0
    unseen_kv_tokens: int = 0
    last_routed_at: float = -1e300  # this EPP's newest pick of the pod (monotonic; -1e300: none)

    def __post_init__(self) -> None:
        # Cheap comparisons only, each field read once: one record per pod per scheduling decision.
        v = self.ttft_ewma
        if v is not None and usable_speed(v) is None:
            self.ttft_ewma = None
        v = self.tpot_ewma
        if v is not None and usable_speed(v) is None:
            self.tpot_ewma = None
        v = self.prefill_tps
        if v is not None and not MIN_PREFILL_TPS <= v <= MAX_COUNT:
            self.prefill_tps = None
        v = self.uncached_fraction
        if v is not None and not 0.0 <= v <= 1.0:
            self.uncached_fraction = None
        v = self.mean_prompt_tokens
        if v is not None and not 0.0 <= v <= MAX_COUNT:
            self.mean_prompt_tokens = None
        age = self.metrics_age
        if not age >= 0.0:
            self.metrics_age = 0.0 if age < 0.0 else math.inf  # NaN: unknown age
        requests, tokens = self.inflight_requests, self.inflight_tokens
        if requests < 0:
            self.inflight_requests = requests = 0
        if tokens < 0:
            self.inflight_tokens = tokens = 0
        m = self.metrics
        if m is None or m.waiting is None:
            return
        if self.pending_requests is not None:  # the ledger: exact for this EPP's picks, the page for the rest
            # The picks the page shows waiting are a backlog whatever the KV; the ones routed
            # since are one only beyond what the page's free KV admits (`kv_room`).
            pending, unseen = float(self.pending_requests), float(self.unseen_pending)
            room = kv_room(m, requests, tokens) if unseen else 0.0
            queue = self.foreign_waiting + pending
            self.queue = queue
            self.backlog = queue - unseen + (unseen - room if unseen > room else 0.0)
            return
        waiting = m.waiting
        done = self.finished_since_scrape
        if done > 0:
            waiting = waiting - done if waiting > done else 0.0
        unseen = requests - waiting - (m.running or 0.0)
        if self.routed_since_scrape > unseen:
            unseen = float(self.routed_since_scrape)
        if unseen > 0:
            room = kv_room(m, requests, tokens)
            self.queue = waiting + unseen
            self.backlog = waiting + (unseen - room if unseen > room else 0.0)
        else:
            self.queue = waiting
            self.backlog = waiting

    @property
    def address(self) -> str:
        return self.endpoint.address

    def kv_level(self, measure: str = "page") -> float | None:
        """KV use as saturation reads it (`thresholds.kvMeasure`): `committed_kv`, or with
        `committed` at least every in-flight request's prompt + expected output over the pod's
        KV capacity less vLLM's admission watermark (unknown capacity: `committed_kv`)."""
        kv = self.committed_kv
        if measure != "committed" or kv is None:
            return kv
        m = self.metrics
        blocks, size = (m.num_gpu_blocks, m.block_size) if m is not None else (None, None)
        if not blocks or not size or not self.inflight_tokens:
            return kv
        whole = self.inflight_tokens / ((1.0 - KV_ADMIT_WATERMARK) * float(blocks) * float(size))
        return whole if whole > kv else kv

    @property
    def committed_kv(self) -> float | None:
        """KV use with this EPP's picks since the page counted in (0..1+): the page's fraction plus
        their prompt + expected output over the pod's KV capacity; the page's alone when the
        capacity is unknown; None when the page has no KV figure."""
        m = self.metrics
        if m is None or m.kv_usage is None:
            return None
        blocks, size = m.num_gpu_blocks, m.block_size
        if not self.unseen_kv_tokens or not blocks or not size:
            return m.kv_usage
        return m.kv_usage + self.unseen_kv_tokens / (float(blocks) * float(size))


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Immutable view of the whole pool for one scheduling decision."""

    endpoints: tuple[EndpointState, ...]
    taken_at: float

    def by_address(self) -> dict[str, EndpointState]:
        return {e.address: e for e in self.endpoints}
