"""Model-server metric dialects as data, and a fast parser for the few lines the EPP needs.

A vLLM /metrics page is tens of kilobytes of histogram buckets; the scheduler needs five or
six series. Instead of decoding and tokenising every line (what a general Prometheus parser
does), one compiled bytes pattern (the wanted names as a trie) skips over the raw page to the
lines that start with a wanted name and only those lines are parsed. That one pass is the
floor of the cost (~30 us for a 38 KB page here): `bytes.find` per name is no faster, since
CPython searches a multi-byte needle byte by byte over lowercase text (~10 us per name and
page, measured), and only a single-byte needle gets memchr. Label blocks are parsed only for
the info-style series whose labels carry the data (LoRA adapters, cache config), once per
distinct block, with a tokenizer that honours escaped quotes and commas inside values.

Aggregation over several series of one gauge (e.g. one per `model_name` or data-parallel
`engine`): counts (waiting, running) are summed; fractions (KV usage) are averaged, since a
sum of percentages is meaningless and the mean is the pod's overall cache occupancy when
its engines are the same size.

Values are checked before they are used (rules in epp/datalayer/pool.py): a NaN, an infinity, a
negative count, a KV fraction outside [0, 1] or a label such as `max_lora="inf"` makes that
one field unknown, is reported in `rejected` (the scraper counts and logs it) and never
raises anything but `MetricsParseError`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from epp.datalayer.pool import Metrics, count_problem, fraction_problem, integer_problem


class MetricsParseError(ValueError):
    """The page is not a metrics page of the expected dialect; the scraper marks the pod stale."""


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


def _common_prefix(names: tuple[str, ...] | list[str]) -> str:
    first, last = min(names), max(names)
    n = 0
    while n < len(first) and first[n] == last[n]:
        n += 1
    return first[:n]


def _alternation(words: list[str]) -> str:
    """A regex matching exactly `words`, factored as a trie (`a(?:b|c)` for `ab`, `ac`): at
    each line start the engine then tests one branch per distinct next character instead of
    every name in turn (34 vs 42 us per 38 KB vLLM page for the scraper's ten names)."""
    if len(words) == 1:
        return re.escape(words[0])
    optional = "" in words
    by_first: dict[str, list[str]] = {}
    for w in words:
        if w:
            by_first.setdefault(w[0], []).append(w)
    branches = []
    for group in by_first.values():
        prefix = _common_prefix(group)
        branches.append(re.escape(prefix) + _alternation([w[len(prefix) :] for w in group]))
    body = branches[0] if len(branches) == 1 and not optional else "(?:" + "|".join(branches) + ")"
    return body + "?" if optional else body


def _line_pattern(names: tuple[str, ...], start: str = r"\n") -> re.Pattern[bytes]:
    """`<start>(name)(rest of line)` over bytes; the rest must start with a label block or
    whitespace, so a name never matches a longer one it is a prefix of (the trie backtracks)."""
    unique = sorted(set(names))
    # A literal prefix outside the group lets the engine skip ahead with a fast search.
    common = _common_prefix(unique)
    tails = _alternation([n[len(common) :] for n in unique])
    return re.compile((start + re.escape(common) + "(" + tails + r")([{ \t][^\n]*)").encode())


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


class Sample(NamedTuple):
    """One series line: its raw label block (without braces) and value. A tuple: one is
    built per matching line per scrape, and a frozen dataclass costs several times more."""

    labels: str
    value: float


# Sample((labels, value)) without NamedTuple's Python-level __new__ (3x cheaper per line).
_new_sample = functools.partial(tuple.__new__, Sample)


class _Scanner(NamedTuple):
    lines: re.Pattern[bytes]  # wanted lines after a newline
    first: re.Pattern[bytes]  # a wanted line at the very start of the page
    by_tail: dict[bytes, str]  # matched tail -> metric name (no per-line decoding)


_SCANNERS: dict[tuple[str, ...], _Scanner] = {}


def _scanner(names: tuple[str, ...]) -> _Scanner:
    scanner = _SCANNERS.get(names)
    if scanner is None:
        if len(_SCANNERS) > 256:  # names come from code, but never grow without bound
            _SCANNERS.clear()
        common = len(_common_prefix(names))
        scanner = _SCANNERS[names] = _Scanner(
            _line_pattern(names), _line_pattern(names, start=""), {n[common:].encode(): n for n in names}
        )
    return scanner


def collect_samples(
    page: bytes | str, names: tuple[str, ...], lenient: tuple[str, ...] = ()
) -> dict[str, list[Sample] | None]:
    """All samples of the metrics `names`, by name, in one regex pass over the raw bytes.

    The page is never decoded, split into lines or copied: the compiled pattern skips to each
    line starting with the names' common prefix, and only matching lines become Python
    objects. A malformed line raises MetricsParseError, except for a name in `lenient`,
    which then maps to None (that metric is unusable, the rest of the page still is).
    """
    if isinstance(page, str):
        page = page.encode("utf-8", errors="replace")
    elif not isinstance(page, bytes):
        page = bytes(page)
    out: dict[str, list[Sample] | None] = {}
    scanner = _scanner(names)
    by_tail = scanner.by_tail
    matches = scanner.lines.findall(page)
    head = scanner.first.match(page)
    if head is not None:
        matches.insert(0, head.groups())
    new_sample = _new_sample
    for tail, rest in matches:
        name = by_tail[tail]
        bucket = out.get(name)
        if bucket is None:
            if name in out:
                continue  # an earlier line of this lenient metric was malformed
            bucket = out[name] = []
        # Fast path: `{labels} value` or ` value`, no timestamp; anything else goes through
        # _parse_rest, which also words the errors.
        if rest[:1] == b"{":
            close = rest.rfind(b"} ")  # the last "}" when the fast float succeeds (a later
            if close > 0:  # "}" would make it fail)
                try:
                    bucket.append(
                        new_sample((rest[1:close].decode("utf-8", "replace"), float(rest[close + 2 :])))
                    )
                    continue
                except ValueError:
                    pass
        elif rest[:1] == b" ":
            try:
                bucket.append(new_sample(("", float(rest))))
                continue
            except ValueError:
                pass
        try:
            bucket.append(_parse_rest(rest, name))
        except MetricsParseError:
            if name not in lenient:
                raise
            out[name] = None
    return out


def find_samples(text: str | bytes, name: str) -> list[Sample]:
    """Every sample of metric `name` (exact name, not a longer one sharing the prefix)."""
    return collect_samples(text, (name,)).get(name) or []


def _parse_rest(rest: bytes, name: str) -> Sample:
    """Parse what follows the metric name: optional {labels}, value, optional timestamp."""
    labels = ""
    after = rest
    if rest.startswith(b"{"):
        close = rest.rfind(b"}")  # values and timestamps never contain '}', so the last one closes
        if close < 0:
            raise MetricsParseError(f"unterminated label set: {_line(name, rest)!r}")
        labels = rest[1:close].decode("utf-8", errors="replace")
        after = rest[close + 1 :]
    if after[:1] in _BLANKS:  # fast path: `<space>value` without a timestamp
        try:
            return Sample(labels, float(after))
        except ValueError:
            pass
    parts = after.split()
    if not parts or len(parts) > 2:
        raise MetricsParseError(f"malformed sample line: {_line(name, rest)!r}")
    try:
        value = float(parts[0])
    except ValueError:
        raise MetricsParseError(f"bad sample value in line: {_line(name, rest)!r}") from None
    return Sample(labels, value)


_BLANKS = (b" ", b"\t")


def _line(name: str, rest: bytes) -> str:
    return (name + rest.decode("utf-8", errors="replace"))[:200]


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def parse_labels(block: str) -> dict[str, str]:
    """Parse `a="x",b="y\\"z"` (the inside of a label block); commas inside values are kept."""
    labels: dict[str, str] = {}
    i, n = 0, len(block)
    while i < n:
        while i < n and block[i] in " \t,":
            i += 1
        if i >= n:
            break
        eq = block.find("=", i)
        if eq < 0:
            raise MetricsParseError(f"label without value in {{{block[:200]}}}")
        key = block[i:eq].strip()
        i = eq + 1
        while i < n and block[i] in " \t":
            i += 1
        if i >= n or block[i] != '"' or not key:
            raise MetricsParseError(f"bad label {key!r} in {{{block[:200]}}}")
        i += 1
        chars: list[str] = []
        while True:
            q = _next_special(block, i)
            if q < 0:
                raise MetricsParseError(f"unterminated label value in {{{block[:200]}}}")
            chars.append(block[i:q])
            if block[q] == '"':
                i = q + 1
                break
            if q + 1 >= n:
                raise MetricsParseError(f"dangling escape in {{{block[:200]}}}")
            nxt = block[q + 1]
            chars.append(_ESCAPES.get(nxt, "\\" + nxt))
            i = q + 2
        labels[key] = "".join(chars)
    return labels


def _next_special(block: str, start: int) -> int:
    quote = block.find('"', start)
    backslash = block.find("\\", start)
    if backslash < 0 or (0 <= quote < backslash):
        return quote
    return backslash


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

    return Metrics(
        waiting=waiting,
        running=running,
        kv_usage=kv,
        scraped_at=scraped_at,
        **fields,  # type: ignore[arg-type]
    )
