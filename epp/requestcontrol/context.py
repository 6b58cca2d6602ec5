"""Everything one EPP process shares across streams, in one place the processor reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from epp.datalayer.pool import Pool
from epp.datalayer.tokenizer import PoolTokenizers
from epp.requestcontrol.dp_ranks import RankRouter
from epp.requestcontrol.flow_control import FlowController
from epp.requestcontrol.header_policy import HeaderPolicy
from epp.requestcontrol.parse import ParseHints
from epp.requestcontrol.scale_from_zero import EmptyPoolHold
from epp.requestcontrol.telemetry import Telemetry
from epp.scheduling.decision import Scheduler
from gateway.config import GatewayConfig
from gateway.tracing import Tracing


@dataclass
class EppContext:
    pool_name: str
    pool: Pool
    scheduler: Scheduler
    config: Callable[[], GatewayConfig]
    telemetry: Telemetry
    header_policy: HeaderPolicy = field(default_factory=HeaderPolicy)  # which client headers count
    fallback_endpoints: int = 0  # extra ranked endpoints appended to the destination list
    tracing: Tracing = field(default_factory=Tracing)  # off unless configured (gateway/tracing.py)
    # Conformance test mode only (epp/requestcontrol/conformance_mode.py): a request header narrows the pool.
    conformance_test_mode: bool = False
    flow: FlowController | None = None  # the queue for a saturated pool (flowControl)
    tokenizers: PoolTokenizers | None = None  # the models' own tokenizers (epp/datalayer/tokenizer.py)
    ranks: RankRouter = field(
        default_factory=RankRouter
    )  # data-parallel pods' ranks (epp/requestcontrol/dp_ranks.py)
    empty_pool: EmptyPoolHold | None = None  # requests waiting for a first ready pod (scaleFromZero)
    _hints: tuple[GatewayConfig, ParseHints] | None = field(default=None, repr=False)

    def parse_hints(self) -> ParseHints:
        """What a parse of this pool's requests reads (epp/requestcontrol/parse.py), per configuration."""
        config = self.config()
        if self._hints is None or self._hints[0] is not config:
            index = getattr(self.scheduler, "prefix_index", None)
            self._hints = (config, ParseHints.for_pools(config, (self.pool_name,), index, unrouted=True))
        return self._hints[1]
