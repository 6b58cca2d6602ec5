"""The CRD's schema is generated from the config schema and stays in sync with it."""

from __future__ import annotations

from pathlib import Path

import jsonschema

from tools.crd import CRD_PATH, render_crd_yaml, spec_schema

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_is_the_generated_one() -> None:
    assert (ROOT / CRD_PATH).read_text() == render_crd_yaml(), "run `python -m tools.crd` and commit"


def test_schema_is_structural() -> None:
    def walk(node: object) -> None:
        if isinstance(node, dict):
            assert "$ref" not in node and "anyOf" not in node and "$defs" not in node
            if "properties" in node:
                assert "additionalProperties" not in node  # structural: one or the other
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec_schema())


def test_schema_accepts_configs_the_parser_accepts_and_rejects_bad_ones() -> None:
    validator = jsonschema.Draft4Validator(spec_schema())
    good = {
        "pools": [
            {"name": "llama", "models": [{"name": "llama", "adapters": ["sql"]}], "fallbackEndpoints": 1}
        ],
        "profiles": {"chat": {"weights": {"queue": 2, "kv-cache": 1}, "priority": -1}},
        "listener": {"maxHeadersCount": 50},
    }
    assert validator.is_valid(good)
    for bad in (
        {"pools": []},
        {**good, "thresholds": {"kvCache": 5}},  # above 1 with `page` only the parser refuses
        {**good, "pools": [{"name": "Bad Name", "models": [{"name": "m"}]}]},
        {**good, "profiles": {"chat": {"weights": {"queue": -1}}}},
    ):
        assert not validator.is_valid(bad), bad


def test_unknown_scorer_names_are_rejected_by_a_cel_rule() -> None:
    weights = spec_schema()["properties"]["profiles"]["additionalProperties"]["properties"]["weights"]
    (rule,) = weights["x-kubernetes-validations"]
    assert (
        "'kv-cache'" in rule["rule"] and "'prefix-cache'" in rule["rule"] and "'kvCache'" not in rule["rule"]
    )
