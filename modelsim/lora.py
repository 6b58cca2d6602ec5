"""LoRA adapter residency: ``max_loras`` GPU slots backed by an LRU CPU cache of ``max_cpu_loras``.

Loading an adapter that is not in a GPU slot costs a CPU->GPU copy when it sits in the CPU cache
and a disk read otherwise (figures from the profile). Adapters of running requests are pinned.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection


class LoraSlots:
    def __init__(self, max_loras: int, max_cpu_loras: int, cpu_ms: float, disk_ms: float) -> None:
        self.max_loras = max_loras
        self.max_cpu_loras = max(max_cpu_loras, max_loras)
        self.cpu_ms = cpu_ms
        self.disk_ms = disk_ms
        self._gpu: OrderedDict[str, None] = OrderedDict()
        self._cpu: OrderedDict[str, None] = OrderedDict()
        self.loads_from_disk = 0
        self.loads_from_cpu = 0

    def resident(self, adapter: str) -> bool:
        return adapter in self._gpu

    def gpu_adapters(self) -> list[str]:
        return list(self._gpu)

    def load_cost_ms(self, adapter: str) -> float:
        """Latency to make ``adapter`` usable now, without changing state."""
        if adapter in self._gpu:
            return 0.0
        return self.cpu_ms if adapter in self._cpu else self.disk_ms

    def ensure(self, adapters: Collection[str], pinned: Collection[str]) -> float:
        """Make ``adapters`` GPU-resident, evicting unpinned LRU ones; return the load time in ms."""
        cost = 0.0
        for a in adapters:
            if a in self._gpu:
                self._gpu.move_to_end(a)
                continue
            if a in self._cpu:
                cost += self.cpu_ms
                self.loads_from_cpu += 1
                self._cpu.move_to_end(a)
            else:
                cost += self.disk_ms
                self.loads_from_disk += 1
                self._cpu[a] = None
                while len(self._cpu) > self.max_cpu_loras:
                    self._cpu.popitem(last=False)
            while len(self._gpu) >= self.max_loras:
                victim = next((g for g in self._gpu if g not in pinned and g not in adapters), None)
                if victim is None:
                    victim = next(iter(self._gpu))
                del self._gpu[victim]
            self._gpu[a] = None
        return cost
