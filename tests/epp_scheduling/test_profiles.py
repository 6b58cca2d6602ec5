import pytest

from epp.scheduling.profiles import BUILTIN_PROFILES, Profile, ProfileError, Thresholds, profiles_from_dict


def test_default_profile_is_the_published_one():
    p = BUILTIN_PROFILES["default"]
    assert dict(p.weights) == {"queue": 2.0, "kv-cache": 2.0, "prefix-cache": 3.0}
    assert p.picker == "max" and p.thresholds == Thresholds(queue_saturated=5, kv_saturated=0.8)


def test_from_dict_accepts_aws_and_config_spellings():
    p = Profile.from_dict(
        {
            "weights": {"queue": 1, "kvCache": 2, "prefix": 3, "loraAffinity": 0.5},
            "picker": "weighted",
            "priority": -1,
            "thresholds": {"queue": 8, "kvCache": 0.9, "staleAfterMs": 250},
        },
        name="bulk",
    )
    assert dict(p.weights) == {"queue": 1.0, "kv-cache": 2.0, "prefix-cache": 3.0, "lora-affinity": 0.5}
    assert p.picker == "weighted-random" and p.priority == -1
    assert p.thresholds == Thresholds(queue_saturated=8, kv_saturated=0.9, stale_after=0.25)


def test_round_trip():
    for p in BUILTIN_PROFILES.values():
        assert Profile.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"weights": {"qeue": 1}}, "profiles.x.weights.qeue"),
        ({"weights": {"queue": -1}}, "profiles.x.weights.queue"),
        ({"weights": {"queue": "2"}}, "profiles.x.weights.queue"),
        ({"weights": {"queue": float("nan")}}, "profiles.x.weights.queue"),
        ({"weights": {"queue": 0}}, "profiles.x.weights"),
        ({"weights": [1, 2]}, "profiles.x.weights"),
        ({"weights": {"queue": 1}, "picker": "best"}, "profiles.x.picker"),
        ({"weights": {"queue": 1}, "colour": "red"}, "profiles.x.colour"),
        (
            {"weights": {"queue": 1}, "thresholds": {"kv_saturated": 1.5}},
            "profiles.x.thresholds.kv_saturated",
        ),
        ({"weights": {"queue": 1}, "thresholds": {"queue": 0}}, "profiles.x.thresholds.queue_saturated"),
        ({"weights": {"queue": 1}, "thresholds": {"speed": 1}}, "profiles.x.thresholds.speed"),
        ({"weights": {"queue": 1}, "thresholds": {"prefix_min_blocks": 2.5}}, "thresholds.prefix_min_blocks"),
        ({"weights": {"queue": 1}, "priority": "high"}, "profiles.x.priority"),
        ({"weights": {"queue": 1, "kvCache": 1, "kv-cache": 2}}, "profiles.x.weights.kv-cache"),
    ],
)
def test_invalid_profile_names_the_field(data, field):
    with pytest.raises(ProfileError) as err:
        Profile.from_dict(data, name="x")
    assert field in str(err.value)


def test_profiles_from_dict_overlays_builtins():
    merged = profiles_from_dict({"chat": {"weights": {"queue": 1}}, "gold": {"weights": {"inflight": 1}}})
    assert dict(merged["chat"].weights) == {"queue": 1.0}
    assert set(merged) == {"default", "chat", "batch", "gold"}
    with pytest.raises(ProfileError, match=r"profiles\.gold\.weights"):
        profiles_from_dict({"gold": {"weights": {}}})


def test_pool_wide_thresholds_apply_unless_a_profile_sets_its_own():
    merged = profiles_from_dict(
        {"gold": {"weights": {"queue": 1}, "thresholds": {"kvCache": 0.7}}},
        thresholds={"queue": 8, "kvCache": 0.9, "staleAfterMs": 500},
    )
    assert merged["default"].thresholds == Thresholds(queue_saturated=8, kv_saturated=0.9, stale_after=0.5)
    assert merged["gold"].thresholds == Thresholds(queue_saturated=8, kv_saturated=0.7, stale_after=0.5)
    assert merged["batch"].thresholds.queue_saturated == 20  # its own tolerant setting stays
    with pytest.raises(ProfileError, match=r"profiles\.default\.thresholds\.queue"):
        profiles_from_dict(thresholds={"queue": -1})
