"""What a scheduling plugin is: one object per catalogue row and scheduler, which may own state.

A plugin runs in three places:
- per decision: its kind's call, `filter`, `score` or `pick`; and `prepare`, once, for the
  plugins the decision's profile names, after its filters and before its scorers (the
  candidates they left and the decision's `ScoringContext`);
- per routed request, from request control (epp/requestcontrol/booking.py), on every plugin
  that overrides the hook: `on_routed` (the pod it was sent to), `on_first_token` (the pod's
  response began: its headers unless a 5xx, the first the EPP sees of it, as response bodies
  are not streamed to the EPP), then exactly one of `on_finished` / `on_aborted` (a 5xx, or closed
  before any response; by default the same as finished). A retry that lands on another pod
  is `on_aborted` on the first and `on_routed` on the second.

State lives on the plugin object; a configuration reload's scheduler takes over the same
objects (`build_scheduler(config, previous)`: `WeightedScheduler(plugins=previous.plugins)`), so
what a plugin learned survives reloads. Its typed parameters are its catalogue row's pydantic
model (gateway/scheduling_params.py), whose fields a profile's `thresholds` carry (`Thresholds`
is the union of those models): `params(ctx)`.

Today's stateless plugins are functions: `FunctionFilter` / `FunctionScorer` / `FunctionPicker`
wrap them without changing them. A new plugin with state is one class in one module and one
catalogue row naming it (`PluginRow("scorer", "my-scorer", "my.module:MyScorer")`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel

from epp.datalayer.endpoint_records import EndpointState
from epp.scheduling.filters import Filter, FilterContext
from epp.scheduling.picker import ExactLoad
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import Scorer, ScoringContext
from gateway.plugin_catalogue import PluginRow

HOOKS = ("on_routed", "on_first_token", "on_finished", "on_aborted")


class LifecycleHooks:
    """What request control tells the scheduler about a routed request; each hook does nothing
    unless overridden (the scheduler calls only the overridden ones)."""

    def on_routed(self, request: InferenceRequest, address: str) -> None:
        """The request was sent to `address`."""

    def on_first_token(self, request: InferenceRequest, address: str) -> None:
        """The pod at `address` began its response (the EPP sees its headers)."""

    def on_finished(self, request: InferenceRequest, address: str) -> None:
        """The request routed to `address` ended there (once per `on_routed`)."""

    def on_aborted(self, request: InferenceRequest, address: str) -> None:
        """The request routed to `address` ended there without a response (a 5xx, a reset, a
        retry elsewhere); instead of `on_finished`. By default the same as finished."""
        self.on_finished(request, address)

    def hooks(self) -> tuple[str, ...]:
        """The lifecycle hooks this plugin's class overrides (the scheduler calls only those;
        `on_aborted` too when only `on_finished` is, which it calls by default)."""
        own = {h for h in HOOKS if getattr(type(self), h) is not getattr(LifecycleHooks, h)}
        if "on_finished" in own:
            own.add("on_aborted")
        return tuple(h for h in HOOKS if h in own)


class Plugin(LifecycleHooks):
    """A catalogue row's plugin; subclasses override what they use."""

    kind: ClassVar[str] = ""

    def __init__(self, row: PluginRow) -> None:
        self.row = row
        self.name = row.name

    def params(self, ctx: ScoringContext | FilterContext) -> BaseModel:
        """This plugin's parameters for the decision: the profile's thresholds, which include
        the row's model's fields (gateway/scheduling_params.py)."""
        return ctx.thresholds

    def prepare(
        self, request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
    ) -> None:
        """Once per decision whose profile names this plugin, after the filters, before any scorer."""

    def prepares(self) -> bool:
        return type(self).prepare is not Plugin.prepare


class FilterPlugin(Plugin):
    kind = "filter"

    def filter(
        self, request: InferenceRequest, candidates: Sequence[EndpointState], ctx: FilterContext
    ) -> list[EndpointState]:
        """The candidates that may take the request, in input order."""
        raise NotImplementedError


class ScorerPlugin(Plugin):
    kind = "scorer"

    def score(
        self, request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
    ) -> list[float]:
        """One value in [0, 1] per candidate, higher is better."""
        raise NotImplementedError


class PickerPlugin(Plugin):
    kind = "picker"

    def pick(
        self,
        totals: Sequence[float],
        rng: random.Random,
        loads: Callable[[int], ExactLoad] | None = None,
        band: float = 0.0,
    ) -> list[int]:
        """Candidate indices, best first."""
        raise NotImplementedError


class FunctionFilter(FilterPlugin):
    """A stateless filter function (epp/scheduling/filters.py) as a plugin."""

    def __init__(self, row: PluginRow, fn: Filter) -> None:
        super().__init__(row)
        self.fn = self.filter = fn  # type: ignore[method-assign, assignment]  # the function itself: no extra call


class FunctionScorer(ScorerPlugin):
    """A stateless scorer function (`score(request, candidates, ctx) -> list[float]`) as a plugin."""

    def __init__(self, row: PluginRow, fn: Scorer) -> None:
        super().__init__(row)
        self.fn = self.score = fn  # type: ignore[method-assign, assignment]


class FunctionPicker(PickerPlugin):
    """A ranking function (epp/scheduling/picker.py) as a plugin."""

    def __init__(self, row: PluginRow, fn: Callable[..., list[int]]) -> None:
        super().__init__(row)
        self.fn = self.pick = fn  # type: ignore[method-assign]


_WRAPPERS: dict[str, Callable[[PluginRow, Any], Plugin]] = {
    "filter": FunctionFilter,
    "scorer": FunctionScorer,
    "picker": FunctionPicker,
}
_BASES: dict[str, type[Plugin]] = {"filter": FilterPlugin, "scorer": ScorerPlugin, "picker": PickerPlugin}


def build(row: PluginRow, target: Any) -> Plugin:
    """The plugin of `row`, whose `function` resolved to `target`: a Plugin class of the row's
    kind is instantiated with the row; a function is wrapped. TypeError for anything else."""
    if isinstance(target, type):
        if not issubclass(target, _BASES[row.kind]):
            raise TypeError(
                f"{row.kind} {row.name!r}: {target.__name__} is not a {_BASES[row.kind].__name__}"
            )
        return target(row)
    if callable(target):
        return _WRAPPERS[row.kind](row, target)
    raise TypeError(f"{row.kind} {row.name!r}: {row.function} is neither a plugin class nor a function")
