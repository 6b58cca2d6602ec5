"""The one table of scheduling plugins: every filter, scorer and picker, by its config name.

An entry holds the kebab-case name used in configuration, the function, the pydantic model
of its parameters (gateway/scheduling_params.py; `None` when it takes none) and, through the
function's docstring, its formula. Profiles are validated against its names
(gateway/profiles.py lists them for the shared schema; checked below), the CRD's scorer-name rule is generated from it
(tools/crd.py), and docs/scheduling.md's plugin table is generated from it
(`python -m tools.plugin_table --doc docs/scheduling.md`; a test fails on drift).
Adding a scorer is one function in scorers.py, one `ScorerEntry` here and its name in
gateway/profiles.py.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from epp.scheduling import affinity, filters, picker, scorers, ttft_prediction
from epp.scheduling.scorers import Scorer
from gateway import profiles
from gateway.scheduling_params import FreshParams, PredictionParams, PrefixParams, SaturationParams


@dataclass(frozen=True, slots=True)
class Plugin:
    """One plugin: its config name, what it runs, and the model of its parameters."""

    name: str
    fn: Callable[..., Any]
    params: type[BaseModel] | None = None

    @property
    def formula(self) -> str:
        """The first paragraph of the function's docstring, on one line."""
        doc = inspect.getdoc(self.fn) or ""
        return " ".join(doc.split("\n\n", 1)[0].split())


@dataclass(frozen=True, slots=True)
class ScorerEntry(Plugin):
    uses_prefix: bool = False  # the scheduler hashes the prompt only for profiles that need it
    uses_tokens: bool = False  # the EPP tokenizes the prompt only for profiles that need it

    @property
    def score(self) -> Scorer:
        return self.fn


def _table(*entries: Plugin) -> Mapping[str, Any]:
    for entry in entries:
        if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", entry.name):
            raise ValueError(f"plugin name {entry.name!r} is not kebab-case")
    return MappingProxyType({e.name: e for e in entries})


# Applied in this order by WeightedScheduler; not configurable per profile, only their params.
FILTERS: Mapping[str, Plugin] = _table(
    Plugin("serving", filters.serving),
    Plugin("healthy", filters.healthy),
    Plugin("fresh", filters.fresh, FreshParams),
    Plugin("unsaturated", filters.unsaturated, SaturationParams),
)

SCORERS: Mapping[str, ScorerEntry] = _table(
    ScorerEntry("queue", scorers.queue),
    ScorerEntry("kv-cache", scorers.kv_cache),
    ScorerEntry("prefix-cache", scorers.prefix_cache, PrefixParams, uses_prefix=True),
    ScorerEntry(
        "precise-prefix-cache", scorers.precise_prefix_cache, PrefixParams, uses_prefix=True, uses_tokens=True
    ),
    ScorerEntry("lora-affinity", scorers.lora_affinity),
    ScorerEntry("running-requests", scorers.running_requests),
    ScorerEntry("inflight", scorers.inflight),
    ScorerEntry("observed-speed", scorers.observed_speed),
    ScorerEntry("queue-speed", scorers.queue_speed),
    ScorerEntry(
        "predicted-ttft", ttft_prediction.predicted_ttft, PredictionParams, uses_prefix=True, uses_tokens=True
    ),
    ScorerEntry("session-affinity", affinity.session_affinity),
)

PICKERS: Mapping[str, Plugin] = _table(
    Plugin("max", picker.rank_max),
    Plugin("weighted-random", picker.rank_weighted_random),
)

SCORER_NAMES: tuple[str, ...] = tuple(SCORERS)
PICKER_NAMES: tuple[str, ...] = tuple(PICKERS)
# The shared schema (gateway/profiles.py, which BBR validates with too) names these plugins
# without loading them: an EPP with a plugin it does not list must not start.
if (SCORER_NAMES, PICKER_NAMES) != (profiles.SCORER_NAMES, profiles.PICKER_NAMES):
    raise RuntimeError("gateway/profiles.py SCORER_NAMES / PICKER_NAMES differ from the registry's plugins")
