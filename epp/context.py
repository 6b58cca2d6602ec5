"""Everything one EPP process shares across streams, in one place the processor reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from epp.config import EppConfig
from epp.flow_control import FlowController
from epp.parse import ParseHints
from epp.pool import Pool
from epp.ranks import RankRouter
from epp.scale_from_zero import EmptyPoolHold
from epp.scheduling.base import Scheduler
from epp.telemetry import Telemetry
from epp.tokenize import PoolTokenizers
from epp.trust import HeaderPolicy
from gateway.tracing import Tracing


@dataclass
class EppContext:
    pool_name: str
    pool: Pool
    scheduler: Scheduler
    config: Callable[[], EppConfig]
    telemetry: Telemetry
    header_policy: HeaderPolicy = field(default_factory=HeaderPolicy)  # which client headers count
    fallback_endpoints: int = 0  # extra ranked endpoints appended to the destination list
    tracing: Tracing = field(default_factory=Tracing)  # off unless configured (gateway/tracing.py)
    # Conformance test mode only (epp/test_picker.py): a request header narrows the pool.
    conformance_test_mode: bool = False
    flow: FlowController | None = None  # the queue for a saturated pool (flowControl)
    tokenizers: PoolTokenizers | None = None  # the models' own tokenizers (epp/tokenize.py)
    ranks: RankRouter = field(default_factory=RankRouter)  # data-parallel pods' ranks (epp/ranks.py)
    empty_pool: EmptyPoolHold | None = None  # requests waiting for a first ready pod (scaleFromZero)
    _hints: tuple[EppConfig, ParseHints] | None = field(default=None, repr=False)

    def parse_hints(self) -> ParseHints:
        """What a parse of this pool's requests reads (epp/parse.py), per configuration."""
        config = self.config()
        if self._hints is None or self._hints[0] is not config:
            index = getattr(self.scheduler, "prefix_index", None)
            self._hints = (config, ParseHints.for_pools(config, (self.pool_name,), index, unrouted=True))
        return self._hints[1]
