"""Admission (epp/requestcontrol/admission.py): a saturated pool refuses sheddable requests with
a 429 that says why and when to come back; everything else is sent."""

from __future__ import annotations

import dataclasses

from epp.requestcontrol.admission import admit
from epp.scheduling.decision import Decision
from gateway.config import parse_config
from tests.epp_scheduling.factories import req

CONFIG = parse_config(
    {"pools": [{"name": "p", "models": [{"name": "m"}]}], "admission": {"retryAfterSeconds": 9}}
)


def test_a_saturated_pool_refuses_a_sheddable_request_with_retry_after() -> None:
    sheddable = dataclasses.replace(req(), priority=-1)
    refusal = admit(sheddable, Decision(("a",), saturated=True), CONFIG)
    assert refusal is not None
    assert (refusal.status, refusal.code, refusal.headers) == (429, "pool_saturated", {"retry-after": "9"})
    assert refusal.message == "the model pool is saturated; sheddable requests are refused until it recovers"


def test_everything_else_is_sent() -> None:
    sheddable = dataclasses.replace(req(), priority=-1)
    assert admit(sheddable, Decision(("a",), saturated=False), CONFIG) is None
    assert admit(req(), Decision(("a",), saturated=True), CONFIG) is None  # priority 0
