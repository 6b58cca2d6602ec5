"""Which LoRA adapters each pod holds in its GPU slots, modelled from what the EPP routed.

vLLM keeps at most `max_loras` adapters on the GPU and evicts the least recently used one
when a request needs another; `vllm:lora_requests_info` names only the adapters of running
and waiting requests, so an adapter that is loaded but idle looks absent to a scrape, and a
LoRA request sent to a pod that just served it pays a full load elsewhere. This model keeps,
per pod, the adapters this EPP sent there in recency order; an adapter is taken as resident
when it is among the pod's `max_lora` most recent (the capacity the pod itself reports), or
when the scrape shows it running. Approximate in the same way as the prefix index: traffic
from other gateways is not seen (the scrape's running set corrects part of that).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

# Adapters remembered per pod, beyond any realistic max_loras (vLLM's default is 1, large
# deployments run 8-32): bounded so a client cycling through adapter names cannot grow it.
MAX_TRACKED_PER_POD = 64


class AdapterResidency:
    def __init__(self, max_tracked: int = MAX_TRACKED_PER_POD) -> None:
        if max_tracked < 1:
            raise ValueError("max_tracked must be >= 1")
        self.max_tracked = max_tracked
        self._pods: dict[str, OrderedDict[str, None]] = {}

    def on_routed(self, address: str, adapter: str) -> None:
        """`adapter` was just sent to `address`: it is that pod's most recently used one."""
        lru = self._pods.get(address)
        if lru is None:
            lru = self._pods[address] = OrderedDict()
        lru[adapter] = None
        lru.move_to_end(adapter)
        if len(lru) > self.max_tracked:
            lru.popitem(last=False)

    def resident(self, address: str, adapter: str, max_lora: int) -> bool:
        """Among the pod's `max_lora` most recently routed adapters (False when unknown)."""
        lru = self._pods.get(address)
        if not lru or max_lora <= 0 or adapter not in lru:
            return False
        for n, name in enumerate(reversed(lru)):
            if n >= max_lora:
                return False
            if name == adapter:
                return True
        return False

    def adapters(self, address: str, max_lora: int) -> list[str]:
        """The modelled GPU set of a pod, most recent first (for /debug and tests)."""
        lru = self._pods.get(address) or OrderedDict()
        return list(reversed(lru))[: max(0, max_lora)]

    def retain(self, addresses: Iterable[str]) -> None:
        """Forget pods that left the pool (a pod that comes back starts with empty slots)."""
        keep = set(addresses)
        for address in [a for a in self._pods if a not in keep]:
            del self._pods[address]
