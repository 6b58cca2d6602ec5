"""What feeds one pool's state, built and wired together: the metrics scraper, the pods'
KV-event subscribers, the models' tokenizers (the token ids the precise prefix index needs) and
the state shared with the pool's other replicas (sharedState). Each feed's callbacks route what
it learns to the pool's records and to the adapter residency, which learns from every feed:
the scrapes' running adapters (this replica's and, shared, its peers'), the events' LoRA ids.

The owner (epp/app.py) configures the feeds from each validated config and syncs them with
the pool's endpoints."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from epp.datalayer.adapter_residency import AdapterResidency, event_time
from epp.datalayer.endpoint_records import Metrics
from epp.datalayer.kv_event_batches import EventBatch, stored_adapters
from epp.datalayer.kv_events import KVEventMetrics, KVEventSubscribers
from epp.datalayer.kv_index import KVIndex
from epp.datalayer.pool import Pool
from epp.datalayer.prefix_index import PrefixIndex
from epp.datalayer.scrape import ScrapeMetrics, Scraper
from epp.datalayer.session_memory import SessionMemory
from epp.datalayer.shared_state import SharedState
from epp.datalayer.tokenizer import PoolTokenizers
from gateway.config import GatewayConfig


class PoolFeeds:
    """One pool's feeds and their callbacks. `residency` is read at each call: the scheduler
    owning it is rebuilt on reloads."""

    def __init__(
        self,
        pool: Pool,
        pool_name: str,
        config: GatewayConfig,
        kv_index: KVIndex,
        registry: CollectorRegistry,
        scrape_metrics: ScrapeMetrics,
        *,
        residency: Callable[[], AdapterResidency],
        prefix_index: PrefixIndex,
        memory: SessionMemory,
    ) -> None:
        """`prefix_index`, `memory`: the scheduler's, shared with the other replicas (both kept
        across reloads)."""
        self.pool = pool
        self.pool_name = pool_name
        self.kv_index = kv_index
        self._residency = residency
        self.scraper = Scraper(pool, telemetry=scrape_metrics)  # cadence: set by configure
        kv_metrics = KVEventMetrics(registry, kv_index)
        self.scraper.scraped_hook = self._on_scraped
        self.kv_events = KVEventSubscribers(
            kv_index,
            kv_metrics,
            on_batch=self._on_kv_batch,
            on_restart=lambda pod: self._residency().forget(pod),  # its slots are empty
        )
        self.tokenizers = PoolTokenizers()
        # In-flight counts shared with the pool's other replicas (sharedState; read once).
        self.shared_state: SharedState | None = None
        if config.shared_state is not None:
            self.shared_state = SharedState(
                pool,
                pool_name,
                config.shared_state,
                registry,
                prefix_index=prefix_index,
                on_scrape=self._on_peer_scrape,
                residency=residency(),  # kept across reloads too
                memory=memory,
            )
        self.shared_config = config.shared_state

    def configure(self, config: GatewayConfig) -> None:
        """The feeds' settings from a validated config (sharedState aside: read at start)."""
        pool = config.pool(self.pool_name)
        if pool.kv_events is not None:
            self.kv_index.set_max_blocks(pool.kv_events.max_blocks)
        self.tokenizers.configure((m.name, m.tokenizer) for m in pool.models)
        self.pool.speed_half_life_s = config.scrape.speed_half_life_ms / 1000
        scrape = config.scrape
        self.scraper.configure(
            scrape.interval_ms / 1000, scrape.max_interval() / 1000, scrape.jitter, scrape.timeout_ms / 1000
        )
        shared = self.shared_state
        self.scraper.sharers = (
            (lambda: 1 + len(shared.peers)) if shared is not None and scrape.share_across_replicas else None
        )

    def sync(self, config: GatewayConfig) -> None:
        """Scrape loops and KV-event subscribers for the pool's current endpoints.

        RuntimeError without a running loop (the owner syncs again once started)."""
        self.scraper.sync()
        self.kv_events.sync(self.pool.endpoints(), config.pool(self.pool_name).kv_events)

    def _on_scraped(self, address: str, metrics: Metrics, sent_at: float) -> None:
        self._note_running_adapters(address, metrics, sent_at)
        if self.shared_state is not None:
            self.shared_state.publish_scrape(address, metrics, sent_at)

    def _on_peer_scrape(self, address: str, metrics: Metrics, sent_at: float) -> None:
        """Another replica's scrape of a pod: recorded as this replica's own when it is newer
        than what this replica holds (its learned speeds come from its own scrapes only)."""
        held = self.pool.metrics(address)
        if held is not None and held.scraped_at >= metrics.scraped_at:
            return
        self.pool.record_metrics(address, metrics, sent_at=sent_at)
        self._note_running_adapters(address, metrics, sent_at)

    def _note_running_adapters(self, address: str, metrics: Metrics, sent_at: float) -> None:
        if metrics.running_adapters:
            self._residency().on_scrape(address, metrics.running_adapters, sent_at)

    def _on_kv_batch(self, pod: str, batch: EventBatch) -> None:
        adapters = stored_adapters(batch)
        if not adapters:
            return
        at = event_time(batch.ts, time.time(), time.monotonic())
        metrics = self.pool.metrics(pod)
        max_lora = metrics.max_lora if metrics is not None else 0
        residency = self._residency()
        for name, lora_id in adapters:
            residency.on_stored(pod, name, lora_id, at, max_lora)
