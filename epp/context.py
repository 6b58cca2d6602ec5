"""Everything one EPP process shares across streams, in one place the processor reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from epp.pool import Pool
from epp.scheduling.base import Scheduler
from epp.telemetry import Telemetry
from gateway.config import GatewayConfig


@dataclass
class EppContext:
    pool_name: str
    pool: Pool
    scheduler: Scheduler
    config: Callable[[], GatewayConfig]
    telemetry: Telemetry
    priorities: dict[str, int] = field(default_factory=dict)  # profile name -> priority
    model_profiles: dict[str, str] = field(default_factory=dict)  # base model -> default profile
    fallback_endpoints: int = 0  # extra ranked endpoints appended to the destination list

    def profile_for(self, base_model: str) -> str | None:
        return self.model_profiles.get(base_model)

    def priority_for(self, objective: str | None) -> int:
        return self.priorities.get(objective, 0) if objective else 0
