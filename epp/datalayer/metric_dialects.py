"""Model-server metric dialects as data, and `parse_metrics`: a /metrics page to `Metrics`.

Each dialect names the few series the EPP reads from one kind of server; the page is scanned
for only those lines (epp/datalayer/metric_lines.py).

Aggregation over several series of one gauge (e.g. one per `model_name` or data-parallel
`engine`): counts (waiting, running) are summed; fractions (KV usage) are averaged, since a
sum of percentages is meaningless and the mean is the pod's overall cache occupancy when
its engines are the same size.

Values are checked before they are used (rules in epp/datalayer/endpoint_records.py): a NaN, an infinity, a
negative count, a KV fraction outside [0, 1] or a label such as `max_lora="inf"` makes that
one field unknown, is reported in `rejected` (the scraper counts and logs it) and never
raises anything but `MetricsParseError`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from epp.datalayer.endpoint_records import Metrics, count_problem, fraction_problem, integer_problem
from epp.datalayer.metric_lines import MetricsParseError, Sample, collect_samples, parse_labels


@dataclass(frozen=True, slots=True)
class Dialect:
    """Where one engine publishes the fields of `Metrics`. Aliases are tried in order."""

    name: str
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_usage: tuple[str, ...] = ()  # a 0..1 fraction (averaged over series)
    kv_tokens: tuple[str, ...] = ()  # tokens held, divided by a known capacity (TGI)
    lora_info: str | None = None  # info series: labels max_lora, running/waiting adapters
    cache_info: str | None = None  # info series: labels block_size, num_gpu_blocks
    # A label whose non-empty values mark per-part series of a count exported beside its total
    # (the total has the label empty): those are left out of the sums (SGLang's `priority`).
    breakdown_label: str | None = None

    def core_names(self) -> tuple[str, ...]:
        return self.waiting + self.running + self.kv_usage + self.kv_tokens

    def wanted_names(self) -> tuple[str, ...]:
        info = tuple(n for n in (self.lora_info, self.cache_info) if n is not None)
        return self.core_names() + info


DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        Dialect(
            name="vllm",
            waiting=("vllm:num_requests_waiting",),
            running=("vllm:num_requests_running",),
            kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            lora_info="vllm:lora_requests_info",
            cache_info="vllm:cache_config_info",
        ),
        Dialect(
            name="sglang",
            waiting=("sglang:num_queue_reqs",),
            running=("sglang:num_running_reqs",),
            kv_usage=("sglang:token_usage",),
            # With --enable-priority-scheduling the queue counts are the total under
            # priority="" plus one series per priority (SchedulerMetricsCollector
            # ._log_gauge_queue_count, sglang 0.5.23; make check-engines).
            breakdown_label="priority",
        ),
        Dialect(
            name="tgi",
            waiting=("tgi_queue_size",),
            running=("tgi_batch_current_size",),
            kv_tokens=("tgi_batch_current_max_tokens",),
        ),
        Dialect(
            name="trtllm",
            waiting=("trtllm_num_requests_waiting",),
            running=("trtllm_num_requests_running",),
            kv_usage=("trtllm_kv_cache_utilization",),
        ),
        # llama.cpp's llama-server (--metrics): busy slots, and requests deferred until a slot
        # frees. It exports no KV-usage gauge (a slot's context is on /slots, not /metrics):
        # KV usage is unknown on this engine (docs/llamacpp.md, what each scorer sees).
        Dialect(
            name="llamacpp",
            waiting=("llamacpp:requests_deferred",),
            running=("llamacpp:requests_processing",),
        ),
    )
}


# Engines whose pages carry no KV measure at all: an unknown KV usage there is the normal case,
# not a warning sign (llama.cpp admits by free slots; predicted-ttft adds no KV wait for it).
NO_KV_GAUGE = frozenset(d.name for d in DIALECTS.values() if not (d.kv_usage or d.kv_tokens))


def get_dialect(name: str) -> Dialect:
    """The dialect called `name`; ValueError naming the known ones otherwise."""
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown metrics dialect {name!r}; known: {', '.join(sorted(DIALECTS))}") from None


@dataclass(frozen=True, slots=True)
class Rejection:
    """One value the parser refused: the field it was for, why, and the raw value (for logs)."""

    field: str  # a `Metrics` field name, or "ttft" / "tpot" for the speed histograms
    reason: str  # non_finite | negative | too_large | out_of_range | not_a_number | not_an_integer
    value: str


def _reject(rejected: list[Rejection] | None, field: str, reason: str, value: object) -> None:
    if rejected is not None:
        rejected.append(Rejection(field, reason, str(value)[:64]))


def _first_sane(
    samples: Mapping[str, list[Sample] | None],
    names: tuple[str, ...],
    field: str,
    rejected: list[Rejection] | None,
    problem_of: Callable[[float], str | None],
) -> list[Sample] | None:
    """The series of the first alias present on the page, or None when there is none or one
    of its series is not sane (the field is then unknown, never a wrong number)."""
    for name in names:
        found = samples.get(name)
        if found:
            for s in found:
                problem = problem_of(s.value)
                if problem:
                    _reject(rejected, field, problem, s.value)
                    return None
            return found
    return None


def _sum_of(
    samples: Mapping[str, list[Sample] | None],
    names: tuple[str, ...],
    field: str,
    rejected: list[Rejection] | None,
    breakdown_label: str | None = None,
) -> float | None:
    """Sum of all series of the first alias present (but for the breakdown series, see
    `Dialect.breakdown_label`); None when absent or not a sane count."""
    found = _first_sane(samples, names, field, rejected, count_problem)
    if found is None:
        return None
    if breakdown_label is not None:
        found = [
            s
            for s in found
            if breakdown_label not in s.labels or not parse_labels(s.labels).get(breakdown_label)
        ]
    total = math.fsum(s.value for s in found)  # each <= MAX_COUNT: no overflow
    problem = count_problem(total)
    if problem:
        _reject(rejected, field, problem, total)
        return None
    return total


def _mean_fraction(
    samples: Mapping[str, list[Sample] | None],
    names: tuple[str, ...],
    field: str,
    rejected: list[Rejection] | None,
) -> float | None:
    """Mean of the first alias's series, each a 0..1 fraction (clamped within KV_TOLERANCE)."""
    found = _first_sane(samples, names, field, rejected, fraction_problem)
    if found is None:
        return None
    return min(1.0, max(0.0, math.fsum(s.value for s in found) / len(found)))


def _adapters(value: str) -> frozenset[str]:
    return frozenset(a for a in (part.strip() for part in value.split(",")) if a)


# Label values that mean "not known yet" (vLLM prints num_gpu_blocks="None" before profiling).
_ABSENT_LABELS = frozenset({"", "None", "none", "null"})


def _int_label(labels: dict[str, str], key: str, rejected: list[Rejection] | None) -> int | None:
    """A finite non-negative integer label (`"16"`, `"16.0"`); None when absent or unusable."""
    raw = labels.get(key)
    if raw is None or raw.strip() in _ABSENT_LABELS:
        return None
    try:
        value = float(raw)
    except ValueError:
        _reject(rejected, key, "not_a_number", raw)
        return None
    problem = integer_problem(value)
    if problem:
        _reject(rejected, key, problem, raw)
        return None
    return int(value)


def _lora_fields(block: str) -> tuple[frozenset[str], frozenset[str], int, tuple[Rejection, ...]]:
    """Running and waiting adapters and max_lora from a LoRA info series' label block."""
    problems: list[Rejection] = []
    labels = parse_labels(block)
    running = _adapters(labels.get("running_lora_adapters", ""))
    waiting = _adapters(labels.get("waiting_lora_adapters", ""))
    return running, waiting, _int_label(labels, "max_lora", problems) or 0, tuple(problems)


def _cache_fields(block: str) -> tuple[int | None, int | None, tuple[Rejection, ...]]:
    """block_size and num_gpu_blocks from a cache-config info series' label block."""
    problems: list[Rejection] = []
    labels = parse_labels(block)
    block_size = _int_label(labels, "block_size", problems)
    if block_size == 0:
        _reject(problems, "block_size", "out_of_range", 0)
        block_size = None
    return block_size, _int_label(labels, "num_gpu_blocks", problems), tuple(problems)


MAX_CACHED_LABELS = 1024  # characters; a longer (hostile) label block is parsed every time
# An info series' labels change only when the server's state does (LoRA adapters loaded), so
# most scrapes parse none of them; the results are immutable, the lists stay bounded.
_cached_lora_fields = functools.lru_cache(maxsize=256)(_lora_fields)
_cached_cache_fields = functools.lru_cache(maxsize=256)(_cache_fields)


def parse_metrics(
    text: str | bytes,
    dialect: str,
    scraped_at: float,
    *,
    kv_capacity_tokens: int | None = None,
    rejected: list[Rejection] | None = None,
    also: tuple[str, ...] = (),
    also_found: dict[str, list[Sample] | None] | None = None,
) -> Metrics:
    """Parse one /metrics page of engine `dialect` into `Metrics`.

    `kv_capacity_tokens` is the KV capacity in tokens when known from configuration; TGI's
    KV usage is `tgi_batch_current_max_tokens / capacity` with it and unknown without it.
    A value that is not finite, negative, absurdly large (> 1e12), a KV fraction outside
    [0, 1] or a non-integer label leaves its field unknown (`None`, or 0 for `max_lora`) and
    is appended to `rejected`. Raises ValueError for an unknown dialect and
    MetricsParseError when the page carries no usable core metric or a wanted line is
    malformed. The samples of the metrics named in `also` (e.g. histogram `_sum` lines)
    are collected in the same pass and stored into `also_found` (None for a name with a
    malformed line: that one is unusable, the page is not).
    """
    d = get_dialect(dialect)
    if not isinstance(text, str | bytes | bytearray | memoryview):
        raise MetricsParseError(f"metrics page must be text, got {type(text).__name__}")

    samples = collect_samples(text, d.wanted_names() + also, lenient=also)
    if also_found is not None:
        for name in also:
            also_found[name] = samples.get(name, [])
    waiting = _sum_of(samples, d.waiting, "waiting", rejected, d.breakdown_label)
    running = _sum_of(samples, d.running, "running", rejected, d.breakdown_label)
    kv = _mean_fraction(samples, d.kv_usage, "kv_usage", rejected) if d.kv_usage else None
    if d.kv_tokens and kv is None:
        held = _sum_of(samples, d.kv_tokens, "kv_usage", rejected)
        if held is not None and kv_capacity_tokens:
            kv = held / kv_capacity_tokens
            if fraction_problem(kv):
                _reject(rejected, "kv_usage", "out_of_range", kv)
                kv = None
            else:
                kv = min(1.0, max(0.0, kv))
    if waiting is None and running is None and kv is None:
        if any(name in samples for name in d.core_names()):
            raise MetricsParseError(f"no usable {d.name} metrics: every core value was rejected")
        wanted = ", ".join(d.core_names())
        raise MetricsParseError(f"no {d.name} metrics on the page (looked for {wanted})")

    fields = _info_fields(d, samples, rejected)
    return Metrics(
        waiting=waiting,
        running=running,
        kv_usage=kv,
        scraped_at=scraped_at,
        **fields,  # type: ignore[arg-type]
    )


def _info_fields(
    d: Dialect, samples: Mapping[str, list[Sample] | None], rejected: list[Rejection] | None
) -> dict[str, object]:
    """The `Metrics` fields an info series' labels carry: LoRA adapters, cache config."""
    fields: dict[str, object] = {}
    if d.lora_info is not None:
        newest: Sample | None = None
        for sample in samples.get(d.lora_info) or ():
            if newest is None or sample.value >= newest.value:
                newest = sample
        if newest is not None:
            running_adapters, waiting_adapters, max_lora, problems = (
                _cached_lora_fields if len(newest.labels) <= MAX_CACHED_LABELS else _lora_fields
            )(newest.labels)
            fields["running_adapters"] = running_adapters
            fields["waiting_adapters"] = waiting_adapters
            fields["max_lora"] = max_lora
            if rejected is not None:
                rejected.extend(problems)
    if d.cache_info is not None:
        for sample in samples.get(d.cache_info) or ():
            block_size, num_gpu_blocks, problems = (
                _cached_cache_fields if len(sample.labels) <= MAX_CACHED_LABELS else _cache_fields
            )(sample.labels)
            fields["block_size"] = block_size
            fields["num_gpu_blocks"] = num_gpu_blocks
            if rejected is not None:
                rejected.extend(problems)
            break
    return fields
