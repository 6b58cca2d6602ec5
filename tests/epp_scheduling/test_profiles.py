import pytest

from epp.scheduling.registry import PICKER_NAMES, SCORER_NAMES
from gateway.profiles import BUILTIN_PROFILES, Profile, ProfileError, profile, profiles_from_dict
from gateway.scheduling_params import Thresholds


def test_default_profile_is_predicted_ttft_with_prefix_affinity_and_the_published_one_is_kept():
    p = BUILTIN_PROFILES["default"]
    assert dict(p.weights) == {"predicted-ttft": 5.0, "precise-prefix-cache": 2.0, "kv-cache": 1.0}
    assert p.picker == "max" and p.thresholds == Thresholds(queue=5, kvCache=0.8)
    gie = BUILTIN_PROFILES["gie"]
    assert dict(gie.weights) == {"queue": 2.0, "kv-cache": 2.0, "prefix-cache": 3.0}


def test_config_spelling_is_kebab_case_names_and_camel_case_thresholds():
    p = profiles_from_dict(
        {
            "bulk": {
                "weights": {"queue": 1, "kv-cache": 2, "prefix-cache": 3, "lora-affinity": 0.5},
                "picker": "weighted-random",
                "priority": -1,
                "thresholds": {"queue": 8, "kvCache": 0.9, "staleAfterMs": 250},
            }
        }
    )["bulk"]
    assert dict(p.weights) == {"queue": 1.0, "kv-cache": 2.0, "prefix-cache": 3.0, "lora-affinity": 0.5}
    assert p.name == "bulk" and p.picker == "weighted-random" and p.priority == -1
    assert p.thresholds == Thresholds(queue=8, kvCache=0.9, staleAfterMs=250)
    assert p.thresholds.stale_after == 0.25


def test_round_trip():
    for p in BUILTIN_PROFILES.values():
        assert profiles_from_dict({p.name: p.to_dict()})[p.name] == p


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"weights": {"qeue": 1}}, "profiles.x.weights"),
        ({"weights": {"kvCache": 1}}, "profiles.x.weights"),  # no alias spellings
        ({"weights": {"queue": -1}}, "profiles.x.weights.queue"),
        ({"weights": {"queue": "2"}}, "profiles.x.weights.queue"),
        ({"weights": {"queue": True}}, "profiles.x.weights.queue"),
        ({"weights": {"queue": float("nan")}}, "profiles.x.weights.queue"),
        ({"weights": {"queue": 0}}, "profiles.x.weights"),
        ({"weights": [1, 2]}, "profiles.x.weights"),
        ({"weights": {"queue": 1}, "picker": "best"}, "profiles.x.picker"),
        ({"weights": {"queue": 1}, "picker": "weighted"}, "profiles.x.picker"),
        ({"weights": {"queue": 1}, "colour": "red"}, "profiles.x.colour"),
        (
            {"weights": {"queue": 1}, "thresholds": {"kvCache": 1.5}},
            "profiles.x.thresholds: Value error, kvCache above 1",
        ),
        ({"weights": {"queue": 1}, "thresholds": {"queue": 0}}, "profiles.x.thresholds.queue"),
        ({"weights": {"queue": 1}, "thresholds": {"speed": 1}}, "profiles.x.thresholds.speed"),
        (
            {"weights": {"queue": 1}, "thresholds": {"queue_saturated": 3}},
            "profiles.x.thresholds.queue_saturated",
        ),
        (
            {"weights": {"queue": 1}, "thresholds": {"prefixMinBlocks": 2.5}},
            "profiles.x.thresholds.prefixMinBlocks",
        ),
        ({"weights": {"queue": 1}, "priority": "high"}, "profiles.x.priority"),
    ],
)
def test_invalid_profile_names_the_field(data, field):
    with pytest.raises(ProfileError) as err:
        profiles_from_dict({"x": data})
    assert str(err.value).startswith(field)


def test_profiles_from_dict_overlays_builtins():
    merged = profiles_from_dict({"chat": {"weights": {"queue": 1}}, "gold": {"weights": {"inflight": 1}}})
    assert dict(merged["chat"].weights) == {"queue": 1.0}
    assert set(merged) == {"default", "gie", "chat", "batch", "predicted", "gold"}
    with pytest.raises(ProfileError, match=r"profiles\.gold\.weights"):
        profiles_from_dict({"gold": {"weights": {}}})


def test_pool_wide_thresholds_apply_unless_a_profile_sets_its_own():
    merged = profiles_from_dict(
        {"gold": {"weights": {"queue": 1}, "thresholds": {"kvCache": 0.7}}},
        {"queue": 8, "kvCache": 0.9, "staleAfterMs": 500},
    )
    assert merged["default"].thresholds == Thresholds(queue=8, kvCache=0.9, staleAfterMs=500)
    assert merged["gold"].thresholds == Thresholds(queue=8, kvCache=0.7, staleAfterMs=500)
    assert merged["batch"].thresholds.queue_saturated == 20  # its own tolerant setting stays
    with pytest.raises(ProfileError, match=r"^thresholds"):
        profiles_from_dict({}, {"queue": -1})


def test_profile_from_code_is_validated_and_named():
    p = profile("spread", {"queue": 1}, picker="weighted-random")
    assert p.name == "spread" and p.picker == "weighted-random"
    with pytest.raises(ProfileError, match=r"profiles\.bad\.weights"):
        profile("bad", {"no-such-scorer": 1})


def test_the_schema_lists_every_registry_name():
    schema = Profile.model_json_schema()
    assert "name" not in schema["properties"]  # the key names a profile, never a field
    assert set(SCORER_NAMES) >= {"queue", "kv-cache", "prefix-cache"} and "max" in PICKER_NAMES
