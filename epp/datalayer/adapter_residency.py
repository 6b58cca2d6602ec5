"""Which LoRA adapters each pod holds in its GPU slots, modelled from everything the EPP sees.

vLLM keeps at most `max_loras` adapters on the GPU and evicts the least recently used one
when a request needs another; `vllm:lora_requests_info` names only the adapters of running
and waiting requests, so an adapter that is loaded but idle looks absent to a scrape, and a
LoRA request sent to a pod that just served it pays a full load elsewhere. This model keeps,
per pod, each adapter's last known use in time order; an adapter is taken as resident when
it is among the pod's `max_lora` most recently used (the capacity the pod itself reports).

Three sources touch an adapter (mark it used at a time):

- routing: this EPP sent a request for it to the pod (`on_routed`, now);
- the scrape: it is among the running adapters (`on_scrape`, at the time the scrape was
  *sent*: the page shows the state at some instant between sending and parsing, so the send
  time is the conservative one). Waiting adapters do not count: vLLM loads an adapter when
  it schedules the request, not when it queues it, so a waiting adapter is not in a slot yet
  (its load shows up later as running or as a KV event); the scorer rates a waiting adapter
  on its own (0.6, lora-affinity);
- KV events: a GPU `BlockStored` for the adapter means the engine ran it in that step
  (`on_stored`, at the batch's engine timestamp translated to this clock, `event_time`);
  a stream that starts again from seq 0 (or reconnects: maybe a new process) forgets the
  pod (`forget`: a new engine has empty slots) before it is read again from seq 0, whose
  replayed batches, stamped with their own times, re-feed what the old process still holds.

A touch never moves an adapter back in time (the newest use wins), so an old observation,
such as a scrape that was in flight while two newer adapters evicted the one it shows, or a
replayed event batch, cannot re-promote an adapter evicted since. The sources other than
routing are what make traffic from other gateways (and clients calling pods directly)
visible; what no source sees stays invisible: an adapter loaded and evicted again between
two scrapes whose requests stored no new KV block (short prompts, prefix-cache hits).

Placement (issue #28). vLLM runs at most `max_loras` adapters per batch: a request whose
adapter finds every slot held by adapters with running requests waits until one of those has
none left, and every request of a holder sent there meanwhile keeps it held. So the EPP also
counts its own requests in flight per pod and adapter (`on_routed` to `on_finished`): with the
page's running adapters, that is which adapters hold the pod's slots and which wait
(`slots`), and `slot_cost` (epp/scheduling/adapter_slots.py) prices each pod for a request from it (read by `predicted-ttft`;
the `adapter_slots` filter keeps a saturated pod that runs the adapter when every other pod
would make it wait). What follows is a placement: an adapter stays on the pod that runs most
of its requests, spills to another only when its queue there outweighs `adapterSlotMs` (the
price of a slot other adapters may need), drains from the extra pod as its demand falls, and
a new adapter takes a free slot before it waits for one.

Events name the adapter with `lora_name` (modelsim, newer vLLM); older vLLM sends only
`lora_id`, the pod's `lora_int_id`, which the OpenAI server assigns from a per-process
counter in registration order (`--lora-modules`, then dynamic loads): it cannot be turned
into a name without knowing that order. `LoraIds` learns it per pod: from events that carry
both (certain), otherwise by intersecting, over that id's events, the sets of adapters this
EPP's own routing holds resident on the pod (the engine ran the id's adapter, so it was in a
slot); one name left after two events is the guess. Routing alone, not the whole model, so a
guess never confirms itself through the touches it caused; an empty intersection starts the
candidates again, and a guess whose name is absent from two consecutive routed sets of its
id is dropped. Traffic from elsewhere can still mislead a guess (an adapter loaded only by
other clients never becomes a candidate); events that name the adapter need none of this.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

# Adapters remembered per pod, beyond any realistic max_loras (vLLM's default is 1, large
# deployments run 8-32): bounded so a client cycling through adapter names cannot grow it.
MAX_TRACKED_PER_POD = 64


def event_time(batch_ts: float, wall_now: float, mono_now: float) -> float:
    """A KV-event batch's engine wall-clock timestamp on this process's monotonic clock: now
    less the batch's lag. A pod clock ahead of ours (negative lag) reads as now; one behind
    makes the batch look old, which only weakens what it says (a touch never moves back)."""
    lag = wall_now - batch_ts
    return mono_now - lag if lag > 0.0 else mono_now


class LoraIds:
    """Per pod, the `lora_int_id` -> adapter name map learned from what the EPP sees."""

    # An inferred name is trusted after this many of its id's events agree, and dropped after
    # this many in a row whose routed set lacks it.
    CONFIRM_EVENTS = 2
    DROP_AFTER_MISSES = 2

    def __init__(self, max_tracked: int = MAX_TRACKED_PER_POD) -> None:
        self.max_tracked = max_tracked
        self._names: dict[str, dict[int, str]] = {}
        self._misses: dict[str, dict[int, int]] = {}  # inferred ids: consecutive misses
        self._candidates: dict[str, dict[int, tuple[frozenset[str], int]]] = {}

    def name(self, address: str, lora_id: int) -> str | None:
        return self._names.get(address, {}).get(lora_id)

    def names(self, address: str) -> dict[int, str]:
        return dict(self._names.get(address, {}))

    def learn(self, address: str, lora_id: int, name: str, *, inferred: bool = False) -> None:
        """The id is this name on this pod (ids and names are 1:1); `inferred`: guessed from
        routing (`narrow`) rather than read from an event carrying both."""
        names = self._names.setdefault(address, {})
        misses = self._misses.setdefault(address, {})
        for other in [i for i, n in names.items() if n == name and i != lora_id]:
            del names[other]  # a restarted pod registered the adapters in another order
            misses.pop(other, None)
        names[lora_id] = name
        if inferred:
            misses[lora_id] = 0
        else:
            misses.pop(lora_id, None)
        if len(names) > self.max_tracked:
            oldest = next(iter(names))
            del names[oldest]
            misses.pop(oldest, None)
        self._candidates.get(address, {}).pop(lora_id, None)

    def narrow(self, address: str, lora_id: int, routed: Iterable[str]) -> str | None:
        """An event with only `lora_id` while `routed` are the adapters this EPP's own routing
        holds resident on the pod (not the whole model: an event attributed by a guess must
        not confirm the guess). The name, or None while it is not settled."""
        routed = frozenset(routed)
        known = self.name(address, lora_id)
        misses = self._misses.get(address, {})
        if known is not None:
            if lora_id not in misses:
                return known  # read from an event: certain
            if not routed or known in routed:
                misses[lora_id] = 0
                return known
            misses[lora_id] += 1
            if misses[lora_id] < self.DROP_AFTER_MISSES:
                return known
            del self._names[address][lora_id]  # the guess keeps disagreeing: start again
            del misses[lora_id]
        now = routed - set(self._names.get(address, {}).values())
        if not now:
            return None
        pending = self._candidates.setdefault(address, {})
        before, seen = pending.get(lora_id, (now, 0))
        left, seen = before & now, seen + 1
        if not left:
            left, seen = now, 1  # the earlier sets were wrong (traffic unseen): start again
        if len(left) == 1 and seen >= self.CONFIRM_EVENTS:
            (name,) = left
            self.learn(address, lora_id, name, inferred=True)
            return name
        pending[lora_id] = (left, seen)
        if len(pending) > self.max_tracked:
            del pending[next(iter(pending))]
        return None

    def forget(self, address: str) -> None:
        for d in (self._names, self._misses, self._candidates):
            d.pop(address, None)

    def retain(self, keep: set[str]) -> None:
        for d in (self._names, self._misses, self._candidates):
            for address in [a for a in d if a not in keep]:
                del d[address]


class AdapterResidency:
    def __init__(
        self, max_tracked: int = MAX_TRACKED_PER_POD, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_tracked < 1:
            raise ValueError("max_tracked must be >= 1")
        self.max_tracked = max_tracked
        self.clock = clock
        # Per pod: adapter -> time of its last known use, kept in ascending time order.
        self._pods: dict[str, OrderedDict[str, float]] = {}
        # The same from this EPP's routing alone: candidates for an id-only event's name.
        self._routed: dict[str, OrderedDict[str, float]] = {}
        self.ids = LoraIds(max_tracked)
        # This EPP's requests in flight per pod and adapter (routed, not yet finished): what pins
        # an adapter's GPU slot, exactly, for this EPP's share of the traffic (placement, below).
        self._active: dict[str, dict[str, _Active]] = {}
        # Per pod, when this EPP's last request of an adapter there finished (a scrape older
        # than that which shows the adapter running shows a slot since released).
        self._finished: dict[str, OrderedDict[str, float]] = {}
        # The other EPP replicas' requests in flight per pod and adapter (epp/datalayer/shared_state.py):
        # their pushed picks add one each, each round trip replaces them with their published
        # counts; slots and in-flight read them beside this EPP's own, so every replica places
        # an adapter where all of them send it.
        self._remote: dict[str, dict[str, _Active]] = {}
        # Called with (address, adapter, output tokens) for each of this EPP's routings (the
        # shared state pushes them to the peers).
        self.routed_hook: Callable[[str, str, int], None] | None = None

    # -- the sources ------------------------------------------------------------------------
    def touch(self, address: str, adapter: str, at: float) -> None:
        """`adapter` ran on `address` at `at` (this process's monotonic clock)."""
        self._touch(self._pods, address, adapter, at)

    def _touch(self, pods: dict[str, OrderedDict[str, float]], address: str, adapter: str, at: float) -> None:
        lru = pods.get(address)
        if lru is None:
            lru = pods[address] = OrderedDict()
        old = lru.get(adapter)
        if old is not None:
            if old >= at:
                return  # already known used at or after `at`
            del lru[adapter]
        lru[adapter] = at  # appended as the newest
        # An older observation than the newest use (a scrape, a late event): the entries used
        # after it go back behind it, keeping time order (few: only those newer than `at`).
        later = []
        names = reversed(lru)
        next(names)  # `adapter` itself
        for name in names:
            if lru[name] <= at:
                break
            later.append(name)
        for name in reversed(later):
            lru.move_to_end(name)
        if len(lru) > self.max_tracked:
            lru.popitem(last=False)

    def on_routed(self, address: str, adapter: str, output_tokens: int = 0) -> None:
        """`adapter` was just sent to `address`: it is that pod's most recently used one, and
        one more of its requests is in flight there until `on_finished` (`output_tokens`: the
        request's expected output, how long it will pin the adapter's slot)."""
        now = self.clock()
        self.touch(address, adapter, now)
        self._touch(self._routed, address, adapter, now)
        _count(self._active.setdefault(address, {}), adapter, now, output_tokens)
        if self.routed_hook is not None:
            self.routed_hook(address, adapter, output_tokens)

    def on_peer_routed(self, address: str, adapter: str, output_tokens: int = 0) -> None:
        """Another replica just sent a request of `adapter` to `address` (its pushed pick): the
        pod's most recently used adapter, one more request of it in flight there until the next
        round trip's counts replace the peers' share."""
        now = self.clock()
        self.touch(address, adapter, now)
        _count(self._remote.setdefault(address, {}), adapter, now, output_tokens)

    def set_remote_active(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """The other replicas' requests in flight per pod and adapter, summed (a round trip's
        reply): they replace the peers' share; an adapter they run is in use there now."""
        now = self.clock()
        remote: dict[str, dict[str, _Active]] = {}
        for address, adapters in counts.items():
            held = self._remote.get(address, {})
            pod: dict[str, _Active] = {}
            for adapter, requests in adapters.items():
                if requests <= 0:
                    continue
                old = held.get(adapter)
                if old is None:
                    pod[adapter] = _Active(requests, now, now, 0)
                else:
                    pod[adapter] = _Active(requests, old.since, old.last_routed, old.last_output_tokens)
                self.touch(address, adapter, now)
            if pod:
                remote[address] = pod
        self._remote = remote

    def local_active(self) -> dict[str, dict[str, int]]:
        """This EPP's own requests in flight per pod and adapter (what it publishes)."""
        return {
            address: {name: a.requests for name, a in pod.items()}
            for address, pod in self._active.items()
            if pod
        }

    def on_finished(self, address: str, adapter: str) -> None:
        """One of this EPP's requests of `adapter` on `address` ended (once per `on_routed`)."""
        pod = self._active.get(address)
        active = pod.get(adapter) if pod is not None else None
        if pod is None or active is None:
            return
        active.requests -= 1
        if active.requests <= 0:
            del pod[adapter]
            finished = self._finished.setdefault(address, OrderedDict())
            finished.pop(adapter, None)
            finished[adapter] = self.clock()
            if len(finished) > self.max_tracked:
                finished.popitem(last=False)

    def in_flight(self, address: str) -> dict[str, int]:
        """The gateway's requests in flight on the pod, per adapter: this EPP's and, with
        shared state, the other replicas'."""
        out = {name: a.requests for name, a in self._active.get(address, {}).items()}
        for name, a in self._remote.get(address, {}).items():
            out[name] = out.get(name, 0) + a.requests
        return out

    def _all_active(self, address: str) -> dict[str, _Active]:
        """This EPP's and the peers' requests in flight on the pod, per adapter."""
        own = self._active.get(address, {})
        remote = self._remote.get(address)
        if not remote:
            return own
        out = dict(own)
        for name, r in remote.items():
            a = out.get(name)
            if a is None:
                out[name] = r
            else:
                newer = r if r.last_routed > a.last_routed else a
                out[name] = _Active(
                    a.requests + r.requests,
                    min(a.since, r.since),
                    newer.last_routed,
                    newer.last_output_tokens,
                )
        return out

    def on_scrape(self, address: str, running: Iterable[str], sent_at: float) -> None:
        """A scrape sent at `sent_at` shows `running` adapters (waiting ones do not count)."""
        for adapter in running:
            self.touch(address, adapter, sent_at)

    def on_stored(
        self, address: str, lora_name: str | None, lora_id: int | None, at: float, max_lora: int
    ) -> str | None:
        """A GPU BlockStored of an adapter at `at`; `max_lora`: the pod's scraped capacity
        (for learning an id's name). The adapter name used, or None when still unknown."""
        if lora_name is not None:
            if lora_id is not None:
                self.ids.learn(address, lora_id, lora_name)
            name: str | None = lora_name
        elif lora_id is not None:
            routed = _newest(self._routed.get(address), max_lora, at) if max_lora > 0 else []
            name = self.ids.narrow(address, lora_id, routed)
        else:
            return None
        if name is not None:
            self.touch(address, name, at)
        return name

    # -- the model --------------------------------------------------------------------------
    def resident(self, address: str, adapter: str, max_lora: int) -> bool:
        """Among the pod's `max_lora` most recently used adapters (False when unknown)."""
        lru = self._pods.get(address)
        if not lru or max_lora <= 0 or adapter not in lru:
            return False
        for n, name in enumerate(reversed(lru)):
            if n >= max_lora:
                return False
            if name == adapter:
                return True
        return False

    def adapters(self, address: str, max_lora: int, at: float | None = None) -> list[str]:
        """The modelled GPU set of a pod, most recent first (for /debug and tests); with
        `at`, the set as of that time (uses after it left out)."""
        return _newest(self._pods.get(address), max_lora, at)

    def forget(self, address: str) -> None:
        """The pod's engine restarted, or may have (its KV event stream said so): empty slots,
        ids assigned anew. Requests in flight stay counted: they end through `on_finished`."""
        self._pods.pop(address, None)
        self._routed.pop(address, None)
        self.ids.forget(address)

    def retain(self, addresses: Iterable[str]) -> None:
        """Forget pods that left the pool (a pod that comes back starts with empty slots)."""
        keep = set(addresses)
        for pods in (self._pods, self._routed, self._active, self._finished, self._remote):
            for address in [a for a in pods if a not in keep]:
                del pods[address]
        self.ids.retain(keep)

    # -- placement ----------------------------------------------------------------------------
    def slots(self, address: str, running: Iterable[str], scraped_at: float) -> list[Slot]:
        """The adapters that need one of the pod's GPU slots now, in the order they got (or
        will get) one: those the last scrape showed running (unless this EPP's last request of
        one finished since: its slot is free again), then this EPP's other adapters in flight
        there, by when their requests began. With `max_lora` slots the first `max_lora` hold
        one and the rest wait for a holder's requests to all end (vLLM runs at most
        `max_lora` adapters per batch)."""
        active = self._all_active(address)
        finished = self._finished.get(address)
        out: list[Slot] = []
        for name in sorted(running):
            a = active.get(name)
            if a is None:
                if finished is not None and finished.get(name, -1.0) > scraped_at:
                    continue  # ours, and all of ours ended after the page was taken
                out.append(Slot(name, 0, None, 0, since=-1.0))
            else:
                out.append(Slot(name, a.requests, a.last_routed, a.last_output_tokens, since=-1.0))
        shown = {s.adapter for s in out}
        rest = [
            Slot(name, a.requests, a.last_routed, a.last_output_tokens, since=a.since)
            for name, a in active.items()
            if name not in shown
        ]
        rest.sort(key=lambda s: s.since)
        return out + rest


@dataclass(slots=True)
class _Active:
    """One adapter's requests of this EPP in flight on one pod."""

    requests: int
    since: float  # when the first of them was routed (the adapter's turn for a slot)
    last_routed: float
    last_output_tokens: int


def _count(pod: dict[str, _Active], adapter: str, now: float, output_tokens: int) -> None:
    """One more request of `adapter` in flight in `pod`'s counts, routed `now`."""
    active = pod.get(adapter)
    if active is None:
        pod[adapter] = _Active(1, now, now, output_tokens)
    else:
        active.requests += 1
        active.last_routed = now
        active.last_output_tokens = output_tokens


@dataclass(frozen=True, slots=True)
class Slot:
    """An adapter that holds, or waits for, a GPU slot on a pod (`AdapterResidency.slots`)."""

    adapter: str
    requests: int  # the gateway's in flight (0: only another client's, seen running on the page)
    last_routed: float | None  # the gateway's newest request of it there (None: none in flight)
    last_output_tokens: int  # that request's expected output tokens
    since: float


def _newest(lru: OrderedDict[str, float] | None, n: int, at: float | None) -> list[str]:
    """The `n` most recently used adapters of `lru`, newest first; with `at`, as of then."""
    if not lru or n <= 0:
        return []
    out = []
    for name, t in reversed(lru.items()):
        if at is None or t <= at:
            out.append(name)
            if len(out) >= n:
                break
    return out
