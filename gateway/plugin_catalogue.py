"""The one catalogue of scheduling plugins: one row per filter, scorer and picker.

A row names the plugin as configuration does (kebab-case), the function the EPP runs
(`module:attribute`, imported by the EPP only: BBR validates profiles with this catalogue and
never loads the scheduler), the pydantic model of its parameters (gateway/scheduling_params.py;
None when it takes none) and what it needs computed per request (the prompt's prefix hashes,
its token ids). Everything reads the same rows: profile validation (gateway/profiles.py), the
scheduler (epp/scheduling/registry.py binds the functions), the CRD and the chart schema
(tools/), docs/scheduling.md's plugin table (`python -m tools.plugin_table`).

Adding a stateless scorer is one function (`score(request, candidates, ctx) -> list[float]`, its
formula in its docstring) and one row here; one with state of its own is one plugin class
(epp/scheduling/plugins/base.py) and one row naming it. `add` registers a row from elsewhere
(an extension, a test).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from gateway.scheduling_params import (
    FreshParams,
    PickParams,
    PredictionParams,
    PrefixParams,
    SaturationParams,
)

Kind = Literal["filter", "scorer", "picker"]


@dataclass(frozen=True, slots=True)
class PluginRow:
    kind: Kind
    name: str
    function: str  # "module:attribute"
    params: type[BaseModel] | None = None
    uses_prefix: bool = False  # the scheduler hashes the prompt only for profiles that need it
    uses_tokens: bool = False  # the EPP tokenizes the prompt only for profiles that need it
    # Its score is the share of the prompt the pod caches: P/D's uncached estimate and the
    # prefix-hit metric read the decision's first such score (one reading token ids first).
    cached_share: bool = False


_SCORERS = "epp.scheduling.scorers"
# Filters in the order the scheduler applies them (epp/scheduling/weighted.py).
_ROWS: list[PluginRow] = [
    PluginRow("filter", "serving", "epp.scheduling.filters:serving"),
    PluginRow("filter", "healthy", "epp.scheduling.filters:healthy"),
    PluginRow("filter", "fresh", "epp.scheduling.filters:fresh", FreshParams),
    PluginRow("filter", "unsaturated", "epp.scheduling.filters:unsaturated", SaturationParams),
    PluginRow("filter", "adapter-slots", "epp.scheduling.filters:adapter_slots"),  # `adapterPlacement`
    PluginRow("scorer", "queue", f"{_SCORERS}:queue"),
    PluginRow("scorer", "kv-cache", f"{_SCORERS}:kv_cache"),
    PluginRow(
        "scorer",
        "prefix-cache",
        f"{_SCORERS}:prefix_cache",
        PrefixParams,
        uses_prefix=True,
        cached_share=True,
    ),
    PluginRow(
        "scorer",
        "precise-prefix-cache",
        f"{_SCORERS}:precise_prefix_cache",
        PrefixParams,
        uses_prefix=True,
        uses_tokens=True,
        cached_share=True,
    ),
    PluginRow("scorer", "lora-affinity", f"{_SCORERS}:lora_affinity"),
    PluginRow("scorer", "running-requests", f"{_SCORERS}:running_requests"),
    PluginRow("scorer", "inflight", f"{_SCORERS}:inflight"),
    PluginRow("scorer", "observed-speed", f"{_SCORERS}:observed_speed"),
    PluginRow("scorer", "queue-speed", f"{_SCORERS}:queue_speed"),
    PluginRow(
        "scorer",
        "predicted-ttft",
        "epp.scheduling.ttft_prediction:predicted_ttft",
        PredictionParams,
        uses_prefix=True,
        uses_tokens=True,
    ),
    PluginRow("scorer", "session-affinity", "epp.scheduling.affinity:session_affinity"),
    PluginRow("picker", "max", "epp.scheduling.picker:rank_max", PickParams),
    PluginRow("picker", "weighted-random", "epp.scheduling.picker:rank_weighted_random", PickParams),
]
_BY_NAME: dict[tuple[str, str], PluginRow] = {(r.kind, r.name): r for r in _ROWS}


def rows(kind: Kind) -> list[PluginRow]:
    """The rows of one kind, in catalogue order."""
    return [r for r in _ROWS if r.kind == kind]


def names(kind: Kind) -> tuple[str, ...]:
    return tuple(r.name for r in _ROWS if r.kind == kind)


def row(kind: Kind, name: str) -> PluginRow:
    """KeyError for a name the catalogue does not hold."""
    return _BY_NAME[kind, name]


@contextlib.contextmanager
def add(new: PluginRow) -> Iterator[PluginRow]:
    """One more row while the block runs (a scorer of an extension or a test); ValueError for
    a name that is not kebab-case or already taken."""
    if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", new.name):
        raise ValueError(f"plugin name {new.name!r} is not kebab-case")
    if new.name in names(new.kind):
        raise ValueError(f"{new.kind} {new.name!r} is already in the catalogue")
    _ROWS.append(new)
    _BY_NAME[new.kind, new.name] = new
    try:
        yield new
    finally:
        _ROWS.remove(new)
        del _BY_NAME[new.kind, new.name]
