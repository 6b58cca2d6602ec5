"""The plugin registry is the one list: docs, CRD and code are checked against it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from epp.scheduling import affinity, scorers, ttft_prediction
from epp.scheduling.registry import FILTERS, PICKERS, SCORERS
from gateway.profiles import Profile
from tools.crd import spec_schema
from tools.plugin_table import with_plugin_table

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
