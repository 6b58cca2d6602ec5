"""A request's latency objective over the scheduler's ranking: which pod gets it.

Without an objective the profile's ranking stands. With one (`x-gateway-slo-ttft-ms` from a
trusted caller, or the profile's `sloTtftMs`), each candidate's predicted time to first token
(the `predicted-ttft` scorer's seconds) is held against it:

- pods predicted to meet it come first, in the profile's order: when the profile's best pod
  meets it nothing changes; when it does not (a pod ranked first for its cached prefix but
  predicted late), the best-ranked pod that meets it takes the request;
- headroom: before those, the slowest pods (by this prompt's own prefill time there, within
  `SAME_SPEED` of the slowest) predicted to meet it with a margin (`HEADROOM_MARGIN` x the
  objective), in the profile's order. A loose request that a slow pod serves in time goes
  there and leaves the fast pods' steps short for the tight ones a slow pod cannot serve;
  identical pods are one class, so on them nothing changes;
- then the others, lowest prediction first, so a request no pod can serve in time gets the
  least-bad one; the caller decides by its band whether to send it there (epp/requestcontrol/processor.py:
  sheddable requests are refused with 429 instead).

Packing by least headroom (the pod predicted closest to the objective) was measured and
dropped: near saturation it loaded one pod with the loose requests until it neared the
objective and sent tight ones where a few milliseconds of prediction error were a miss,
lowering attainment from 99 % to 94 % (docs/benchmarks/slo.md). The headroom step differs: a
margin bounds what a slow pod takes, the pods of the slow class share in the profile's order,
and a tight request's margin no slow pod meets leaves it to the fast ones as before.
Pure: predictions in, an order out.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.datalayer.endpoint_records import EndpointState
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.ttft_prediction import predict_ttft

# Headroom: a slow pod takes a request only when predicted to serve it within this share of
# its objective, so a prediction error or a burst behind it still leaves it in time, and a slow
# pod busy with one loose request is left to the tight ones that overflow the fast pods.
# Chosen on tuning seeds 100-102 of slo-interactive-batch at 18 and 24 req/s (docs/benchmarks/slo.md):
# 0.2 met 97.4 % / 91.9 % (means), 0.15 96.1 / 90.5, 0.25 97.8 / 90.8, 0.3 97.3 / 89.2.
HEADROOM_MARGIN = 0.2
# Pods whose prefill of this prompt is within this factor of the slowest's are its class.
SAME_SPEED = 1.5


class LatencyObjective:
    """The last step of every ranking (`WeightedScheduler.rank`): a request with an objective
    gets `slo_order` over the candidates' predictions (made once per decision: the
    `predicted-ttft` scorer's, whether the profile weighs it or not)."""

    def order(
        self,
        request: InferenceRequest,
        order: list[int],
        candidates: Sequence[EndpointState],
        ctx: ScoringContext,
    ) -> tuple[list[int], bool | None]:
        """The order to route by, and whether its first pod is predicted to meet the objective
        (None: the request has none)."""
        if request.slo_ttft_s is None or not order:
            return order, None
        terms = predict_ttft(request, candidates, ctx)
        predicted = [None if t is None else t.total_s for t in terms]
        work = [None if t is None else t.prefill_work_s for t in terms]
        return slo_order(order, predicted, request.slo_ttft_s, work)


def slo_order(
    order: Sequence[int],
    predicted_s: Sequence[float | None],
    slo_s: float,
    prefill_s: Sequence[float | None] | None = None,
) -> tuple[list[int], bool]:
    """`order` (indices into `predicted_s`, best first) rearranged for the objective `slo_s`,
    and whether its first pod is predicted to meet it. `prefill_s`: the prompt's own prefill
    time per pod (its speed there), for the headroom step; without it, no headroom step. Pods
    without a prediction keep their place after the predicted ones (a pod never scraped is
    not known to be fast)."""
    meeting = [i for i in order if (p := predicted_s[i]) is not None and p <= slo_s]
    missing = [i for i in order if (p := predicted_s[i]) is not None and p > slo_s]
    unknown = [i for i in order if predicted_s[i] is None]
    missing.sort(key=lambda i: predicted_s[i] or 0.0)  # least bad first
    if prefill_s is not None:
        meeting = _slow_with_margin_first(meeting, predicted_s, slo_s, prefill_s)
    return [*meeting, *missing, *unknown], bool(meeting)


def _slow_with_margin_first(
    meeting: list[int], predicted_s: Sequence[float | None], slo_s: float, prefill_s: Sequence[float | None]
) -> list[int]:
    """The meeting pods, those of the slowest class with margin first (profile order kept);
    unchanged when no meeting pod is faster than that class (nothing to keep free)."""
    roomy = [i for i in meeting if (predicted_s[i] or 0.0) <= HEADROOM_MARGIN * slo_s and prefill_s[i]]
    if not roomy:
        return meeting
    slowest = max(prefill_s[i] or 0.0 for i in roomy)
    fastest = min((p for i in meeting if (p := prefill_s[i])), default=slowest)
    if fastest * SAME_SPEED > slowest:
        return meeting
    slow = [i for i in roomy if (prefill_s[i] or 0.0) * SAME_SPEED > slowest]
    return [*slow, *(i for i in meeting if i not in slow)]
