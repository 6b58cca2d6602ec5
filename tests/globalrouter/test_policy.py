"""Member selection: cost first under the TTFT objective, spill-over, ramp-up, health."""

from __future__ import annotations

import random

import pytest

from globalrouter.config import ConfigError, parse_config
from globalrouter.members import MemberBook, ModelLoad
from globalrouter.policy import Candidate, candidates, choose, estimate_ttft

MODEL = "m"


def config(**extra: object):
    return parse_config(
        {
            "members": [
                {
                    "name": "cheap",
                    "address": "127.0.0.1:1001",
                    "region": "us-east-1",
                    "cost_per_1k_tokens": 0.2,
                },
                {
                    "name": "dear",
                    "address": "127.0.0.1:1002",
                    "region": "us-west-2",
                    "cost_per_1k_tokens": 0.6,
                },
            ],
            "startup_grace_s": 1.0,
            "ramp_s": 10.0,
            "assumed_output_tokens": 100,
            **extra,
        }
    )


def load(**kw: float) -> ModelLoad:
    base: dict = {"model": MODEL, "ready_pods": 2, "capacity": 4, "ttft_s": 0.1, "tpot_s": 0.005}
    base.update(kw)
    return ModelLoad(**base)


def beat(book: MemberBook, name: str, now: float, **kw: float) -> None:
    state = book.members[name]
    book.heartbeat(
        name, now, region=state.member.region, cost_per_1k_tokens=state.cost_per_1k_tokens,
        draining=False, models=[load(**kw)],
    )  # fmt: skip


def pick_shares(book: MemberBook, now: float, n: int = 2000, region: str | None = None) -> dict[str, float]:
    rng = random.Random(7)
    counts: dict[str, int] = {}
    for _ in range(n):
        choice = choose(candidates(book, MODEL, region, now), book.config.ttft_objective_s, rng.random)
        assert choice is not None
        counts[choice.name] = counts.get(choice.name, 0) + 1
    return {k: v / n for k, v in counts.items()}


def test_estimate_grows_with_queue_and_kv() -> None:
    cfg = config()
    idle = estimate_ttft(load(), 0, cfg)
    assert idle == pytest.approx(0.1)  # free slots: just the TTFT
    queued = estimate_ttft(load(avg_queue=2, running=4, inflight_requests=8), 0, cfg)
    # 8 busy + this one - 4 slots = 5 queued over 4 slots, each holding 0.1 + 0.5 s.
    assert queued == pytest.approx(0.1 + 5 / 4 * 0.6)
    full_kv = estimate_ttft(load(avg_kv_usage=0.97), 0, cfg)
    assert full_kv == pytest.approx(0.1 + 0.6)


def test_recent_routes_count_as_load_in_proportion_to_their_duration() -> None:
    cfg = config(burst_window_s=1.0)
    # 10 routes in the last second, each holding a slot 0.6 s: ~6 still running.
    assert estimate_ttft(load(), 10, cfg) == pytest.approx(0.1 + (6 + 1 - 4) / 4 * 0.6)


def test_cheap_member_takes_low_load_and_spills_when_it_misses_the_objective() -> None:
    book = MemberBook(config(), started_at=0.0)
    beat(book, "cheap", 0.5)
    beat(book, "dear", 0.5)
    assert pick_shares(book, 1.0) == {"cheap": 1.0}
    # Cheap gets queued: 4 waiting per pod -> estimate 0.1 + 9/4 * 0.6 = 1.45 s > 1 s objective.
    beat(book, "cheap", 1.2, avg_queue=4, running=4, inflight_requests=12)
    beat(book, "dear", 1.2)
    assert pick_shares(book, 1.3) == {"dear": 1.0}


def test_burst_between_heartbeats_spills_over() -> None:
    """No new heartbeat yet, but our own routes fill the cheap member: the next go to dear."""
    book = MemberBook(config(ttft_objective_s=0.5, burst_window_s=1.0), started_at=0.0)
    beat(book, "cheap", 0.5)
    beat(book, "dear", 0.5)
    picks = []
    for i in range(20):
        now = 0.6 + i * 0.001
        choice = choose(candidates(book, MODEL, None, now), 0.5)
        assert choice is not None
        book.note_routed(choice.name, now)
        picks.append(choice.name)
    assert picks[0] == "cheap"
    assert "dear" in picks
    assert picks.count("cheap") < 20


def test_best_effort_when_nobody_meets_the_objective() -> None:
    book = MemberBook(config(ttft_objective_s=0.05), started_at=0.0)
    beat(book, "cheap", 0.5, ttft_s=0.3)
    beat(book, "dear", 0.5, ttft_s=0.2)
    choice = choose(candidates(book, MODEL, None, 0.6), 0.05)
    assert choice is not None and choice.name == "dear" and choice.reason == "best-effort"


def test_region_proximity_breaks_cost_ties_and_adds_network_time() -> None:
    cfg = config(region_rtt_ms={"us-east-1|us-west-2": 70})
    book = MemberBook(cfg, started_at=0.0)
    book.members["dear"].cost_per_1k_tokens = 0.2
    beat(book, "cheap", 0.5)
    beat(book, "dear", 0.5)
    book.members["dear"].cost_per_1k_tokens = 0.2  # heartbeat carried 0.6: make them equal
    book.members["cheap"].cost_per_1k_tokens = 0.2
    assert pick_shares(book, 0.6, region="us-west-2") == {"dear": 1.0}
    assert pick_shares(book, 0.6, region="us-east-1") == {"cheap": 1.0}
    far = next(c for c in candidates(book, MODEL, "us-east-1", 0.6) if c.name == "dear")
    assert far.rtt_s == pytest.approx(0.07) and far.ttft_s == pytest.approx(0.1 + 0.07)


def test_stale_heartbeat_takes_a_member_out_and_its_return_ramps_linearly() -> None:
    book = MemberBook(config(), started_at=0.0)
    beat(book, "cheap", 0.5)
    beat(book, "dear", 0.5)
    for t in (1.5, 2.0, 3.0, 4.0):
        beat(book, "dear", t)
    assert {c.name for c in candidates(book, MODEL, None, 2.1)} == {"dear"}  # cheap: 1.6 s stale
    beat(book, "cheap", 5.0)  # back
    beat(book, "dear", 5.0)
    shares = []
    for step in range(9):  # a heartbeat every 1.25 s; measure every 2.5 s
        t = 5.0 + step * 1.25
        beat(book, "cheap", t)
        beat(book, "dear", t)
        if step % 2 == 0:
            shares.append(pick_shares(book, t).get("cheap", 0.0))
    assert shares[0] < 0.05
    for expected, got in zip((0.25, 0.5, 0.75), shares[1:4], strict=True):
        assert got == pytest.approx(expected, abs=0.05)
    assert shares[-1] == 1.0


def test_members_seen_at_startup_do_not_ramp() -> None:
    book = MemberBook(config(), started_at=0.0)
    beat(book, "cheap", 0.5)
    assert book.ramp(book.members["cheap"], 0.6) == 1.0
    late = MemberBook(config(), started_at=0.0)
    beat(late, "cheap", 5.0)  # joined after the grace period
    assert late.ramp(late.members["cheap"], 5.0) < 0.1


def test_passive_failures_eject_then_ramp_back() -> None:
    book = MemberBook(config(passive_health={"consecutive_failures": 3, "eject_s": 2.0}), started_at=0.0)
    beat(book, "cheap", 0.5)
    for i in range(2):
        book.record_outcome("cheap", False, 0.6 + i * 0.01)
    assert book.available(book.members["cheap"], 0.7)
    book.record_outcome("cheap", False, 0.7)
    state = book.members["cheap"]
    assert not book.available(state, 0.8)
    beat(book, "cheap", 2.8)
    assert book.available(state, 2.8)
    assert book.ramp(state, 2.8) < 0.1  # ramps from the end of the ejection


def test_hard_failure_ejects_at_once() -> None:
    book = MemberBook(config(), started_at=0.0)
    beat(book, "cheap", 0.5)
    book.record_outcome("cheap", False, 0.6, hard=True)
    assert not book.available(book.members["cheap"], 0.6)


def test_error_rate_trips_without_a_run_of_failures() -> None:
    book = MemberBook(config(passive_health={"min_requests": 4, "error_rate": 0.5}), started_at=0.0)
    beat(book, "cheap", 0.5)
    for ok in (True, False, True, False):
        book.record_outcome("cheap", ok, 0.6)
    assert not book.available(book.members["cheap"], 0.6)


def test_reported_errors_draining_and_missing_models_exclude() -> None:
    book = MemberBook(config(), started_at=0.0)
    beat(book, "cheap", 0.5, error_rate=0.9)
    beat(book, "dear", 0.5, ready_pods=0)
    assert candidates(book, MODEL, None, 0.6) == []
    assert candidates(book, "other-model", None, 0.6) == []
    state = book.members["cheap"]
    book.heartbeat("cheap", 0.7, region="", cost_per_1k_tokens=0.2, draining=True, models=[load()])
    assert not book.available(state, 0.7)


def test_unknown_cluster_heartbeat_is_refused() -> None:
    book = MemberBook(config(), started_at=0.0)
    assert not book.heartbeat("nope", 0.1, region="", cost_per_1k_tokens=0, draining=False, models=[])


def test_balanced_mode_spreads_by_speed() -> None:
    cands = [Candidate("a", 0.0, 0.0, 0.1, 1.0), Candidate("b", 0.0, 0.0, 0.3, 1.0)]
    rng = random.Random(3)
    picks = [choose(cands, None, rng.random).name for _ in range(4000)]  # type: ignore[union-attr]
    assert picks.count("a") / 4000 == pytest.approx(0.75, abs=0.03)
    assert choose([], 1.0) is None


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"members": []}, "members"),
        ({"members": [{"name": "Bad_Name", "address": "127.0.0.1:1"}]}, "DNS label"),
        ({"members": [{"name": "a", "address": "localhost:1"}]}, "IP address"),
        ({"members": [{"name": "a", "address": "127.0.0.1:1"}] * 2}, "duplicate"),
        (
            {"members": [{"name": "a", "address": "127.0.0.1:1"}], "region_rtt_ms": {"x": 1}},
            "region-a|region-b",
        ),
        ({"members": [{"name": "a", "address": "127.0.0.1:1"}], "ramp_s": -1}, "ramp_s"),
    ],
)
def test_bad_config_is_a_readable_error(data: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_config(data)
