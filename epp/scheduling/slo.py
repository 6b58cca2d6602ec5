"""A request's latency objective over the scheduler's ranking: which pod gets it.

Without an objective the profile's ranking stands. With one (`x-gateway-slo-ttft-ms` from a
trusted caller, or the profile's `sloTtftMs`), each candidate's predicted time to first token
(the `predicted-ttft` scorer's seconds) is held against it:

- pods predicted to meet it come first, the one with the *least* headroom first (the slowest pod
  that still makes it): a loose objective then fills the slower or busier pods and leaves the
  fast ones to tight objectives, where always taking the lowest prediction would give every
  request the fast pods until they too are slow;
- then the others, lowest prediction first, so a request no pod can serve in time gets the
  least-bad one; the caller decides by its band whether to send it there (epp/processor.py:
  sheddable requests are refused with 429 instead).

Pure: predictions in, an order out.
"""

from __future__ import annotations

from collections.abc import Sequence


def slo_order(
    order: Sequence[int], predicted_s: Sequence[float | None], slo_s: float
) -> tuple[list[int], bool]:
    """`order` (indices into `predicted_s`, best first) rearranged for the objective `slo_s`,
    and whether its first pod is predicted to meet it. Pods without a prediction keep their
    place after the predicted ones (a pod never scraped is not known to be fast)."""
    meeting = [i for i in order if (p := predicted_s[i]) is not None and p <= slo_s]
    missing = [i for i in order if (p := predicted_s[i]) is not None and p > slo_s]
    unknown = [i for i in order if predicted_s[i] is None]
    meeting.sort(key=lambda i: slo_s - (predicted_s[i] or 0.0))  # least headroom first (stable)
    missing.sort(key=lambda i: predicted_s[i] or 0.0)  # least bad first
    return [*meeting, *missing, *unknown], bool(meeting)
