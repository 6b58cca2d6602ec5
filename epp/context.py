"""Everything one EPP process shares across streams, in one place the processor reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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

    def profile_for(self, base_model: str) -> str | None:
        for model in self.config().pool(self.pool_name).models:
            if model.name == base_model:
                return model.profile
        return None

    def priority_for(self, objective: str | None) -> int:
        if objective is None:
            return 0
        profile = self.config().profiles.get(objective)
        return profile.priority if profile else 0
