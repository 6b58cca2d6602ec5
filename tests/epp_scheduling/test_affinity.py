"""Session affinity: rendezvous hashing over the candidates, and response ids that name their pod."""

from __future__ import annotations

from epp.datalayer.endpoint_records import Endpoint, EndpointState, Metrics, PoolSnapshot
from epp.scheduling.affinity import (
    pin_to_producer,
    pod_tag,
    producer_tag,
    rendezvous_pick,
    response_id_for,
    session_affinity,
)
from epp.scheduling.request import InferenceRequest, parse_request
from epp.scheduling.scorers import ScoringContext

PODS = [f"10.0.0.{i}:8000" for i in range(1, 6)]


def state(address: str, waiting: float = 0.0) -> EndpointState:
    return EndpointState(Endpoint(address, frozenset({"m"})), Metrics(waiting=waiting), 0.0)


def request(session: str | None = None, previous: str | None = None) -> InferenceRequest:
    body = {"model": "m", "input": "hi", **({"previous_response_id": previous} if previous else {})}
    return parse_request(
        body, request_id="r", target_model="m", adapter=None, headers={}, session_key=session
    )


def owners(pods: list[str], sessions: list[str]) -> dict[str, str]:
    return {s: pods[rendezvous_pick(s, pods)] for s in sessions}


def test_a_pod_leaving_or_joining_moves_only_its_own_sessions() -> None:
    sessions = [f"session-{i}" for i in range(500)]
    before = owners(PODS, sessions)
    assert len(set(before.values())) == len(PODS)  # every pod owns some
    gone = PODS[2]
    after = owners([p for p in PODS if p != gone], sessions)
    moved = {s for s in sessions if before[s] != after[s]}
    assert moved == {s for s in sessions if before[s] == gone}
    joined = owners([*PODS, "10.0.0.9:8000"], sessions)
    assert all(joined[s] in (before[s], "10.0.0.9:8000") for s in sessions)


def test_scorer_is_one_hot_on_the_rendezvous_pod_and_neutral_when_it_is_saturated() -> None:
    candidates = [state(a) for a in PODS]
    scores = session_affinity(request("abc"), candidates, ScoringContext())
    assert sorted(scores) == [0.0] * 4 + [1.0]
    assert PODS[scores.index(1.0)] == PODS[rendezvous_pick("abc", PODS)]
    assert session_affinity(request(None), candidates, ScoringContext()) == [0.0] * 5
    best = rendezvous_pick("abc", PODS)
    candidates[best] = state(PODS[best], waiting=50)
    assert session_affinity(request("abc"), candidates, ScoringContext()) == [0.0] * 5


def test_response_ids_name_their_pod_and_pin_the_follow_up() -> None:
    rid = response_id_for(PODS[3])
    assert rid.startswith("resp_") and producer_tag(rid) == pod_tag(PODS[3])
    assert producer_tag("resp_" + "0" * 32) is None and producer_tag("chatcmpl-1") is None
    snap = PoolSnapshot(tuple(state(a) for a in PODS), 0.0)
    assert [s.address for s in pin_to_producer(snap, rid).endpoints] == [PODS[3]]
    assert pin_to_producer(snap, None) is snap
    gone = PoolSnapshot(tuple(state(a) for a in PODS if a != PODS[3]), 0.0)
    assert pin_to_producer(gone, rid) is gone  # the producer left: schedule normally
    assert request(previous=rid).previous_response_id == rid
