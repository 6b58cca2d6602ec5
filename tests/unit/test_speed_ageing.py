"""Observed-speed EWMAs age: old observations weigh less, and expire after a few half-lives."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epp.app import EppApp
from epp.datalayer.endpoint_records import Endpoint
from epp.datalayer.pod_speeds import SPEED_EWMA_ALPHA, SPEED_EXPIRY_HALF_LIVES
from epp.datalayer.pool import Pool

A = "10.0.0.1:8000"


def tpot(pool: Pool, now: float) -> float | None:
    return pool.snapshot(now).by_address()[A].tpot_ewma


def test_frequent_observations_are_a_plain_ewma() -> None:
    pool = Pool([Endpoint(A, frozenset({"m"}))], speed_half_life_s=10.0)
    pool.observe_speed(A, tpot=0.10, now=0.0)
    pool.observe_speed(A, tpot=0.20, now=0.0)
    assert tpot(pool, 0.0) == pytest.approx(0.10 + SPEED_EWMA_ALPHA * 0.10)


def test_an_old_estimate_weighs_half_as_much_per_half_life() -> None:
    pool = Pool([Endpoint(A, frozenset({"m"}))], speed_half_life_s=10.0)
    pool.observe_speed(A, tpot=1.0, now=0.0)  # slow once (a big batch, a noisy neighbour)
    pool.observe_speed(A, tpot=0.1, now=20.0)  # two half-lives later it is fast again
    keep = (1 - SPEED_EWMA_ALPHA) * 0.25
    assert tpot(pool, 20.0) == pytest.approx(0.1 + keep * 0.9)
    assert tpot(pool, 20.0) < 0.1 + (1 - SPEED_EWMA_ALPHA) * 0.9  # what the old EWMA kept


def test_a_pod_slow_once_is_unknown_again_after_the_expiry() -> None:
    pool = Pool(
        [Endpoint(A, frozenset({"m"})), Endpoint("10.0.0.2:8000", frozenset({"m"}))], speed_half_life_s=2.0
    )
    pool.observe_speed(A, ttft=3.0, tpot=0.5, now=0.0)
    horizon = SPEED_EXPIRY_HALF_LIVES * 2.0
    state = pool.snapshot(horizon - 0.01).by_address()[A]
    assert (state.ttft_ewma, state.tpot_ewma) == (3.0, 0.5)
    state = pool.snapshot(horizon).by_address()[A]
    assert (state.ttft_ewma, state.tpot_ewma) == (None, None)  # the scorers use the median now
    pool.observe_speed(A, tpot=0.05, now=horizon + 1)  # a fresh observation starts over
    assert tpot(pool, horizon + 1) == 0.05


def test_the_half_life_comes_from_the_config_and_follows_reloads(tmp_path: Path) -> None:
    def write(half_life_ms: int) -> Path:
        path = tmp_path / "gw.yaml"
        config = {
            "pools": [{"name": "p", "models": [{"name": "m"}], "endpoints": [{"address": "127.0.0.1:9"}]}],
            "scrape": {"speedHalfLifeMs": half_life_ms},
        }
        path.write_text(yaml.safe_dump(config))
        return path

    app = EppApp(write(2500), "p")
    assert app.pool.speed_half_life_s == 2.5
    write(700)
    assert app._watcher.check()
    assert app.pool.speed_half_life_s == 0.7


def test_the_scrape_is_shared_by_the_live_replicas_unless_turned_off(tmp_path: Path) -> None:
    """No Redis is contacted here: the replicas sharing the scrape are this one plus the peers
    the shared-state loop last saw (none until it has seen any, or while Redis is down)."""

    def write(share: bool, shared: bool = True) -> Path:
        path = tmp_path / "gw.yaml"
        config: dict = {
            "pools": [{"name": "p", "models": [{"name": "m"}], "endpoints": [{"address": "127.0.0.1:9"}]}],
            "scrape": {"shareAcrossReplicas": share},
        }
        if shared:
            config["sharedState"] = {"redis": "redis://127.0.0.1:9"}
        path.write_text(yaml.safe_dump(config))
        return path

    app = EppApp(write(True), "p")
    assert app.shared_state is not None and app.scraper.sharers is not None
    assert app.scraper.sharers() == 1
    app.shared_state.peers = ["r2", "r3"]
    assert app.scraper.sharers() == 3
    write(False)
    assert app._watcher.check()
    assert app.scraper.sharers is None  # each replica scrapes at the full rate
    assert EppApp(write(True, shared=False), "p").scraper.sharers is None
