"""A request's latency objective over the scheduler's ranking: which pod gets it.

Without an objective the profile's ranking stands. With one (`x-gateway-slo-ttft-ms` from a
trusted caller, or the profile's `sloTtftMs`), each candidate's predicted time to first token
(the `predicted-ttft` scorer's seconds) is held against it:

- pods predicted to meet it come first, in the profile's order: when the profile's best pod
  meets it nothing changes; when it does not (a pod ranked first for its cached prefix but
  predicted late), the best-ranked pod that meets it takes the request;
- then the others, lowest prediction first, so a request no pod can serve in time gets the
  least-bad one; the caller decides by its band whether to send it there (epp/requestcontrol/processor.py:
  sheddable requests are refused with 429 instead).

Packing by least headroom (the slowest pod that still meets the objective) was measured and
dropped: near saturation it loaded one pod with the loose requests and sent tight ones where a
few milliseconds of prediction error were a miss, lowering attainment from 99 % to 94 %
(docs/benchmarks/slo.md). Pure: predictions in, an order out.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.datalayer.endpoint_records import EndpointState
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.ttft_prediction import predict_ttft


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
        predicted = [None if t is None else t.total_s for t in predict_ttft(request, candidates, ctx)]
        return slo_order(order, predicted, request.slo_ttft_s)


def slo_order(
    order: Sequence[int], predicted_s: Sequence[float | None], slo_s: float
) -> tuple[list[int], bool]:
    """`order` (indices into `predicted_s`, best first) rearranged for the objective `slo_s`,
    and whether its first pod is predicted to meet it. Pods without a prediction keep their
    place after the predicted ones (a pod never scraped is not known to be fast)."""
    meeting = [i for i in order if (p := predicted_s[i]) is not None and p <= slo_s]
    missing = [i for i in order if (p := predicted_s[i]) is not None and p > slo_s]
    unknown = [i for i in order if predicted_s[i] is None]
    missing.sort(key=lambda i: predicted_s[i] or 0.0)  # least bad first
    return [*meeting, *missing, *unknown], bool(meeting)
