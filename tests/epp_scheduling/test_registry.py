"""The plugin catalogue is the one list: docs, CRD, profiles and the scheduler read its rows."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from epp.datalayer.endpoint_records import EndpointState
from epp.scheduling import affinity, scorers, ttft_prediction
from epp.scheduling.filters import FilterContext
from epp.scheduling.registry import FILTERS, PICKERS, SCORERS
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.weighted import WeightedScheduler
from gateway import plugin_catalogue
from gateway.plugin_catalogue import PluginRow
from gateway.profiles import Profile, ProfileError, profile
from tools.crd import spec_schema
from tools.plugin_table import plugin_table, with_plugin_table

from .factories import req, snap, state

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_plugin_table_is_the_generated_one() -> None:
    doc = (ROOT / "docs/scheduling.md").read_text()
    assert with_plugin_table(doc) == doc, "run `python -m tools.plugin_table --doc docs/scheduling.md`"


def test_names_are_kebab_case_and_every_entry_has_a_formula() -> None:
    for table in (FILTERS, SCORERS, PICKERS):
        for name, entry in table.items():
            assert re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", name) and entry.name == name
            assert len(entry.formula) > 20, name


def test_every_scorer_function_is_registered() -> None:
    """A scorer written but never registered would be unreachable from any config."""
    public = {
        name
        for module in (scorers, ttft_prediction)
        for name, fn in vars(module).items()
        if inspect.isfunction(fn)
        and fn.__module__ == module.__name__
        and not name.startswith("_")
        and inspect.signature(fn).return_annotation == "list[float]"  # a Scorer, not a helper
    }
    registered = {entry.fn.__name__ for entry in SCORERS.values()}
    assert public <= registered
    assert registered - public == {affinity.session_affinity.__name__}  # lives beside its hashing


def test_config_schema_and_crd_take_their_names_from_the_registry() -> None:
    schema = Profile.model_json_schema()
    assert schema["properties"]["picker"]["enum"] == list(PICKERS)
    weights = spec_schema()["properties"]["profiles"]["additionalProperties"]["properties"]["weights"]
    (rule,) = weights["x-kubernetes-validations"]
    assert all(f"'{name}'" in rule["rule"] for name in SCORERS)


def fewest_running(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """1 / (1 + running requests): a scorer that exists only in this test."""
    return [1.0 / (1.0 + (c.metrics.running or 0.0)) if c.metrics else 0.0 for c in candidates]


def test_a_new_scorer_is_one_function_and_one_row() -> None:
    """#43: the row is all the catalogue needs; a profile weighs it by name, the scheduler runs
    it, the docs table and the CRD's name rule list it; outside the block it is unknown again."""
    with plugin_catalogue.add(PluginRow("scorer", "fewest-running", f"{__name__}:fewest_running")):
        only = profile("only", {"fewest-running": 1})
        scheduler = WeightedScheduler({"only": only}, default_profile="only")
        decision = scheduler.pick(req(), snap(state("busy", running=6), state("idle", running=1)))
        assert decision.ranked == ("idle", "busy")
        assert decision.scores["idle"]["fewest-running"] == pytest.approx(0.5)
        assert "| scorer | `fewest-running` | - | 1 / (1 + running requests)" in plugin_table()
        weights = spec_schema()["properties"]["profiles"]["additionalProperties"]["properties"]["weights"]
        assert "'fewest-running'" in weights["x-kubernetes-validations"][0]["rule"]
    with pytest.raises(ProfileError, match="unknown scorer 'fewest-running'"):
        profile("only", {"fewest-running": 1})
    assert "fewest-running" not in SCORERS


def test_a_row_needs_a_new_kebab_case_name() -> None:
    with (
        pytest.raises(ValueError, match="kebab-case"),
        plugin_catalogue.add(PluginRow("scorer", "Bad_Name", "x:y")),
    ):
        pass
    with (
        pytest.raises(ValueError, match="already"),
        plugin_catalogue.add(PluginRow("scorer", "queue", "x:y")),
    ):
        pass


def not_busy(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: FilterContext
) -> list[EndpointState]:
    """Pods other than `busy`: a filter that exists only in this test."""
    return [c for c in candidates if c.address != "busy"]


def test_the_scheduler_runs_the_filters_of_the_catalogue_in_its_order() -> None:
    pods = snap(state("busy", running=0), state("idle", running=6))
    only = profile("only", {"running-requests": 1})
    assert WeightedScheduler({"only": only}, default_profile="only").pick(req(), pods).ranked[0] == "busy"
    with plugin_catalogue.add(PluginRow("filter", "not-busy", f"{__name__}:not_busy")):
        scheduler = WeightedScheduler({"only": only}, default_profile="only")
        assert scheduler.pick(req(), pods).ranked == ("idle",)
        assert list(FILTERS)[-1] == "not-busy"
