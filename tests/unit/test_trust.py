"""The request-header trust rule (epp/requestcontrol/header_policy.py): who sees the fleet, who picks a priority."""

from __future__ import annotations

import pytest

from epp.requestcontrol.header_policy import HeaderPolicy, Objective
from extproc.headers import CLAIM_HEADER, DECISION_HEADER, OBJECTIVE_HEADER, SLO_TTFT_HEADER
from gateway.config import ConfigError, parse_config

JWT = {"issuer": "https://issuer.test", "jwks": '{"keys": [{"kty": "RSA", "n": "x", "e": "AQAB"}]}'}


def config(trust: dict | None = None, **model: object) -> dict:
    return {
        "pools": [
            {"name": "p", "models": [{"name": "bulk", "profile": "batch", **model}, {"name": "chatty"}]}
        ],
        "profiles": {
            "batch": {"weights": {"prefix-cache": 4}, "priority": -1},
            "sheddable": {"weights": {"queue": 1}, "priority": -2},
            "gold": {"weights": {"queue": 1}, "priority": 5},
        },
        "listener": {"jwt": JWT, "trust": trust or {}},
    }


def policy(trust: dict | None = None, **model: object) -> HeaderPolicy:
    return HeaderPolicy.from_config(parse_config(config(trust, **model)))


def test_a_sheddable_model_stays_sheddable_whatever_the_client_names() -> None:
    p = policy()
    assert p.objective({}, "bulk") == Objective("batch", -1)
    for asked in ("default", "chat", "gold", "nonsense", ""):
        assert p.objective({OBJECTIVE_HEADER: asked}, "bulk") == Objective("batch", -1), asked


def test_allowed_objectives_never_raise_the_priority() -> None:
    p = policy(objectives=["chat", "sheddable"])
    assert p.objective({OBJECTIVE_HEADER: "chat"}, "bulk") == Objective("chat", -1)  # weights, not priority
    assert p.objective({OBJECTIVE_HEADER: "sheddable"}, "bulk") == Objective("sheddable", -2)  # lower is fine
    assert p.objective({OBJECTIVE_HEADER: "gold"}, "bulk") == Objective("batch", -1)  # not allowed: ignored


def test_a_model_without_a_profile_gets_the_default_profile_and_its_priority() -> None:
    p = policy()
    assert p.objective({OBJECTIVE_HEADER: "gold"}, "chatty") == Objective("default", 0)


@pytest.mark.parametrize(
    ("trust", "headers"),
    [
        pytest.param({"internal": True}, {}, id="internal-listener"),
        pytest.param({"jwtClaim": {"name": "role", "value": "ops"}}, {CLAIM_HEADER: "ops"}, id="jwt-claim"),
    ],
)
def test_trusted_requests_pick_any_profile_and_see_the_decision(trust: dict, headers: dict) -> None:
    p = policy(trust)
    assert p.trusted(headers)
    assert p.objective({**headers, OBJECTIVE_HEADER: "gold"}, "bulk") == Objective("gold", 5)
    assert p.objective({**headers, OBJECTIVE_HEADER: "nonsense"}, "bulk") == Objective("batch", -1)
    assert p.explain({**headers, DECISION_HEADER: "true"})


def test_untrusted_requests_do_not_see_the_decision_unless_configured() -> None:
    claim = {"jwtClaim": {"name": "role", "value": "ops"}}
    assert not policy(claim).explain({DECISION_HEADER: "true", CLAIM_HEADER: "someone-else"})
    assert not policy().explain({DECISION_HEADER: "true"})
    assert policy({"decisionHeader": True}).explain({DECISION_HEADER: "1"})
    assert not policy({"decisionHeader": True}).explain({DECISION_HEADER: "no"})


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        pytest.param(
            {"objectives": ["platinum"]}, "profile 'platinum' is not defined", id="unknown-objective"
        ),
        pytest.param({"profile": "platinum"}, "profile 'platinum' is not defined", id="unknown-profile"),
    ],
)
def test_objectives_must_name_defined_profiles(patch: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(config(**patch))


def test_a_trusted_claim_needs_jwt_and_paths_need_one_policy() -> None:
    data = config({"jwtClaim": {"name": "role", "value": "ops"}})
    del data["listener"]["jwt"]
    with pytest.raises(ConfigError, match=r"trust\.jwtClaim needs listener\.jwt"):
        parse_config(data)
    with pytest.raises(ConfigError, match="allowAllPaths"):
        parse_config({**config(), "listener": {"allowAllPaths": True, "paths": ["/v1/completions"]}})
    with pytest.raises(ConfigError, match="paths"):
        parse_config({**config(), "listener": {"paths": ["/v1/completions?x=1"]}})
    assert parse_config({**config(), "listener": {"allowAllPaths": True}}).listener.allow_all_paths


def test_an_inference_objective_sets_the_priority_never_above_the_model_for_untrusted() -> None:
    """An InferenceObjective named by the header: its priority, capped at the model's own for
    untrusted requests; the profile (weights) still follows the profile rules."""
    cfg = parse_config(config({"jwtClaim": {"name": "role", "value": "ops"}}, objectives=["sheddable"]))
    p = HeaderPolicy.from_config(cfg, {"background": -5, "vip": 7, "sheddable": -9})
    trusted = {CLAIM_HEADER: "ops"}
    assert p.objective({OBJECTIVE_HEADER: "background"}, "chatty") == Objective("default", -5)
    assert p.objective({OBJECTIVE_HEADER: "vip"}, "chatty") == Objective("default", 0)  # capped
    assert p.objective({OBJECTIVE_HEADER: "vip"}, "bulk") == Objective("batch", -1)  # still sheddable
    assert p.objective({**trusted, OBJECTIVE_HEADER: "vip"}, "bulk") == Objective("batch", 7)
    # Both a profile and an InferenceObjective: the profile's weights, the resource's priority.
    assert p.objective({OBJECTIVE_HEADER: "sheddable"}, "bulk") == Objective("sheddable", -9)
    assert p.objective({OBJECTIVE_HEADER: "sheddable"}, "chatty") == Objective("default", -9)


def test_an_untrusted_latency_objective_is_ignored_and_flagged_for_the_log() -> None:
    untrusted, internal = policy(), policy({"internal": True})
    asked = {SLO_TTFT_HEADER: "250"}
    assert untrusted.slo_ttft_s(asked, "default") is None and untrusted.slo_ignored(asked)
    assert internal.slo_ttft_s(asked, "default") == 0.25 and not internal.slo_ignored(asked)
    assert not untrusted.slo_ignored({})


def test_a_model_without_a_profile_gets_the_configured_default_profiles_priority() -> None:
    data = config()
    data["defaultProfile"] = "sheddable"
    p = HeaderPolicy.from_config(parse_config(data))
    assert p.objective({}, "chatty") == Objective("sheddable", -2)


def test_a_verified_claim_makes_a_latency_objective_header_count() -> None:
    """Trust by JWT claim (not only `internal`): the header counts with the claim Envoy copied
    from a verified token, and is ignored without it."""
    p = policy({"jwtClaim": {"name": "tier", "value": "gold"}})
    assert p.slo_ttft_s({CLAIM_HEADER: "gold", SLO_TTFT_HEADER: "5"}, "batch") == 0.005
    assert p.slo_ttft_s({CLAIM_HEADER: "silver", SLO_TTFT_HEADER: "5"}, "batch") is None
    assert p.slo_ttft_s({SLO_TTFT_HEADER: "5"}, "batch") is None
