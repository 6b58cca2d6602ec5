"""Session affinity: keep a conversation on one pod, the same one from every EPP replica.

Two keys, both stateless so any number of EPP replicas agree without talking to each other:

- A session header (`sessionAffinity.header`, e.g. `x-session-id`): the `session-affinity`
  scorer ranks the candidates by rendezvous (highest-random-weight) hashing of the session key
  with each pod's address. A pod joining or leaving moves only the sessions it wins or won;
  every other session keeps its pod. When the affine pod is saturated the scorer is neutral (all
  zero) and the load scorers decide; a saturated pod is usually dropped by the saturation filter
  first, and then its sessions go, consistently, to their second rendezvous choice.
- `/v1/responses` with `previous_response_id`: vLLM keeps a stored response in the memory of
  the server that produced it, so the follow-up must reach that pod. The EPP cannot read
  response bodies, so it chooses the id instead: for a `/v1/responses` request it sets vLLM's
  `request_id` body field (a documented vLLM extra parameter, used as the response id) to
  `resp_<8-hex tag of the chosen pod><32 hex>`. A later `previous_response_id` with a tag that
  matches a pod of the pool pins the request to that pod (`pin_to_producer`). Limitations: a
  client that sets `request_id` itself gets no tag (then only the session header helps); when
  Envoy falls back to another endpoint the tag names the pod first chosen; a pod that left the
  pool cannot answer and the request is scheduled normally (vLLM then returns 404).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from epp.datalayer.endpoint_records import EndpointState, PoolSnapshot
from epp.scheduling.request import InferenceRequest
from epp.scheduling.saturation import is_saturated

if TYPE_CHECKING:
    from epp.scheduling.scorers import ScoringContext

RESPONSE_ID_PREFIX = "resp_"
_TAG_CHARS = 8


def pod_tag(address: str) -> str:
    """A short, stable name of a pod address for response ids (not a secret)."""
    return hashlib.blake2b(address.encode(), digest_size=_TAG_CHARS // 2).hexdigest()


def response_id_for(address: str) -> str:
    """A vLLM `request_id` (hence response id) that names the pod which will produce it."""
    return f"{RESPONSE_ID_PREFIX}{pod_tag(address)}{uuid.uuid4().hex}"


def producer_tag(response_id: str | None) -> str | None:
    """The pod tag of an id made by `response_id_for`, None for any other id."""
    if not response_id or not response_id.startswith(RESPONSE_ID_PREFIX):
        return None
    body = response_id[len(RESPONSE_ID_PREFIX) :]
    if len(body) != _TAG_CHARS + 32 or any(c not in "0123456789abcdef" for c in body):
        return None
    return body[:_TAG_CHARS]


def pin_to_producer(snapshot: PoolSnapshot, previous_response_id: str | None) -> PoolSnapshot:
    """Only the pod that produced `previous_response_id`, when it is in the pool; else all."""
    tag = producer_tag(previous_response_id)
    if tag is None:
        return snapshot
    pinned = tuple(s for s in snapshot.endpoints if pod_tag(s.address) == tag)
    return PoolSnapshot(pinned, snapshot.taken_at) if pinned else snapshot


def rendezvous_weight(key: str, address: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\x00{address}".encode(), digest_size=8).digest(), "big")


def rendezvous_pick(key: str, addresses: Sequence[str]) -> int:
    """Index of the address with the highest weight for `key` (-1 for none)."""
    best, best_weight = -1, -1
    for i, address in enumerate(addresses):
        weight = rendezvous_weight(key, address)
        if weight > best_weight:
            best, best_weight = i, weight
    return best


def session_affinity(
    request: InferenceRequest, candidates: Sequence[EndpointState], ctx: ScoringContext
) -> list[float]:
    """1 for the session's rendezvous pod, 0 elsewhere; all 0 without a session key or when
    that pod is saturated (neutral: the load scorers decide)."""
    scores = [0.0] * len(candidates)
    key = request.session_key
    if not key or not candidates:
        return scores
    addresses = ctx.addresses if ctx.addresses is not None else [s.address for s in candidates]
    best = rendezvous_pick(key, addresses)
    if not is_saturated(candidates[best], ctx.thresholds):
        scores[best] = 1.0
    return scores
