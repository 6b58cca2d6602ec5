"""The scheduler's side of the plugin catalogue (gateway/plugin_catalogue.py): each row's
function or plugin class, imported once, with its formula (the first paragraph of its
docstring, which docs/scheduling.md's plugin table shows), and `Plugins`, the plugin objects
(epp/scheduling/plugins/base.py) a scheduler runs.

`FILTERS`, `SCORERS` and `PICKERS` are views of the catalogue by config name: a row added to it
(`gateway.plugin_catalogue.add`) is a plugin here at once, and a profile may weigh it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from pydantic import BaseModel

from epp.scheduling.plugins import base
from epp.scheduling.scorers import Scorer
from gateway import plugin_catalogue
from gateway.plugin_catalogue import Kind, PluginRow


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


def _function(path: str) -> Callable[..., Any]:
    module, _, attribute = path.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), attribute)
    return fn


def _entry(row: PluginRow) -> Plugin:
    fn = _function(row.function)
    if row.kind == "scorer":
        return ScorerEntry(row.name, fn, row.params, uses_prefix=row.uses_prefix, uses_tokens=row.uses_tokens)
    return Plugin(row.name, fn, row.params)


P = TypeVar("P", bound=Plugin)


class _Plugins(Mapping[str, P], Generic[P]):
    """The catalogue's rows of one kind, by name, bound to their functions (each row once)."""

    def __init__(self, kind: Kind) -> None:
        self._kind = kind
        self._bound: dict[PluginRow, P] = {}

    def __getitem__(self, name: str) -> P:
        row = plugin_catalogue.row(self._kind, name)
        entry = self._bound.get(row)
        if entry is None:
            entry = cast(P, _entry(row))
            self._bound[row] = entry
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(plugin_catalogue.names(self._kind))

    def __len__(self) -> int:
        return len(plugin_catalogue.names(self._kind))


# Filters in the catalogue's order: the chain of a profile that does not name its own.
FILTERS: Mapping[str, Plugin] = _Plugins("filter")
SCORERS: Mapping[str, ScorerEntry] = _Plugins("scorer")
PICKERS: Mapping[str, Plugin] = _Plugins("picker")

SCORER_NAMES: tuple[str, ...] = tuple(SCORERS)
_KINDS: dict[Kind, Mapping[str, Plugin]] = {"filter": FILTERS, "scorer": SCORERS, "picker": PICKERS}


def cached_share(scores: Mapping[str, float]) -> float | None:
    """The share of the prompt the pod caches, from one pod's decision scores: the first score
    of a `cached_share` row (one that reads token ids before one that does not); None: none."""
    rows = [r for r in plugin_catalogue.rows("scorer") if r.cached_share and r.name in scores]
    if not rows:
        return None
    return scores[min(rows, key=lambda r: not r.uses_tokens).name]


class Plugins:
    """The plugin objects of one scheduler, one per catalogue row, built when first asked for;
    a scheduler that replaces another (a configuration reload) takes over its `Plugins`, hence
    their state. A row replaced in the catalogue gets a new object."""

    def __init__(self) -> None:
        self._objects: dict[PluginRow, base.Plugin] = {}

    def _get(self, kind: Kind, name: str) -> base.Plugin:
        row = plugin_catalogue.row(kind, name)
        plugin = self._objects.get(row)
        if plugin is None:
            entry = _KINDS[kind][name]  # the function or class, imported once
            plugin = self._objects[row] = base.build(row, entry.fn)
        return plugin

    def filter(self, name: str) -> base.FilterPlugin:
        return cast(base.FilterPlugin, self._get("filter", name))

    def scorer(self, name: str) -> base.ScorerPlugin:
        return cast(base.ScorerPlugin, self._get("scorer", name))

    def picker(self, name: str) -> base.PickerPlugin:
        return cast(base.PickerPlugin, self._get("picker", name))


PICKER_NAMES: tuple[str, ...] = tuple(PICKERS)
