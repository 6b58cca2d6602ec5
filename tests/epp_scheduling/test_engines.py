import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.micro.metric_pages import AWKWARD_MODEL, PAGES, PageSpec, tgi_page, vllm_page
from epp.datalayer.metric_dialects import DIALECTS, Rejection, parse_metrics
from epp.datalayer.metric_lines import MetricsParseError, find_samples, parse_labels

KV_NAMES = {
    "vllm": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "sglang": ("sglang:token_usage",),
    "trtllm": ("trtllm_kv_cache_utilization",),
}


def reference(page: bytes, dialect: str) -> dict:
    """What prometheus_client's own parser says, aggregated as documented in epp.datalayer.metric_dialects."""
    fams = {f.name: f for f in text_string_to_metric_families(page.decode())}

    def values(*names):
        for n in names:
            if n in fams:
                return [s.value for s in fams[n].samples]
        return []

    d = DIALECTS[dialect]
    out = {"waiting": math.fsum(values(*d.waiting)), "running": math.fsum(values(*d.running))}
    kv = values(*KV_NAMES.get(dialect, ()))
    out["kv"] = math.fsum(kv) / len(kv) if kv else 0.0
    if dialect == "vllm":
        newest = max(fams["vllm:lora_requests_info"].samples, key=lambda s: s.value).labels
        out["running_adapters"] = {a for a in newest["running_lora_adapters"].split(",") if a}
        out["waiting_adapters"] = {a for a in newest["waiting_lora_adapters"].split(",") if a}
        out["max_lora"] = int(newest["max_lora"])
        cache = fams["vllm:cache_config_info"].samples[0].labels
        out["block_size"] = int(cache["block_size"])
        out["num_gpu_blocks"] = int(cache["num_gpu_blocks"])
    return out


@pytest.mark.parametrize("dialect", sorted(PAGES))
@pytest.mark.parametrize(
    "spec",
    [
        PageSpec(),
        PageSpec(waiting=(0.0,), running=(0.0,), kv=(0.0,), histogram_models=3),
        PageSpec(waiting=(12, 0, 4), running=(1, 1, 1), kv=(0.9, 0.1, 0.5), legacy_kv_name=True),
    ],
)
def test_parser_agrees_with_prometheus_client(dialect, spec):
    page = PAGES[dialect](spec)
    got = parse_metrics(page, dialect, scraped_at=12.5)
    want = reference(page, dialect)
    assert got.scraped_at == 12.5
    assert got.waiting == pytest.approx(want["waiting"])
    assert got.running == pytest.approx(want["running"])
    if dialect != "tgi":
        assert got.kv_usage == pytest.approx(want["kv"])
    if dialect == "vllm":
        assert got.running_adapters == want["running_adapters"]
        assert got.waiting_adapters == want["waiting_adapters"]
        assert (got.max_lora, got.block_size, got.num_gpu_blocks) == (
            want["max_lora"],
            want["block_size"],
            want["num_gpu_blocks"],
        )


def test_vllm_newest_lora_series_wins_and_sums_series():
    m = parse_metrics(vllm_page().decode(), "vllm", 0.0)
    assert m.running_adapters == {"sql-lora", "chat-lora"} and m.waiting_adapters == {"math-lora"}
    assert (m.waiting, m.running, m.kv_usage) == (4.0, 9.0, pytest.approx(0.5))


def test_sglang_priority_breakdown_is_not_counted_twice():
    """SGLang with priority scheduling: the total under priority="" and one series per priority."""
    base = 'model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"'
    lines = []
    for name, total, parts in (("sglang:num_queue_reqs", 5, (2, 3)), ("sglang:num_running_reqs", 4, (4, 0))):
        lines.append(f'{name}{{{base},priority=""}} {total}')
        lines += [f'{name}{{{base},priority="{p}"}} {v}' for p, v in enumerate(parts)]
    lines.append(f'sglang:token_usage{{{base},priority=""}} 0.5')
    m = parse_metrics("\n".join(lines) + "\n", "sglang", 0.0)
    assert (m.waiting, m.running, m.kv_usage) == (5, 4, 0.5)
    # without priority scheduling there is no such label: every series counts (data parallel)
    plain = "\n".join(f'sglang:num_queue_reqs{{dp_rank="{r}"}} 2' for r in (0, 1)) + "\n"
    assert parse_metrics(plain, "sglang", 0.0).waiting == 4


def test_tgi_kv_needs_a_capacity():
    page = tgi_page(max_tokens=3000)
    assert parse_metrics(page, "tgi", 0.0).kv_usage is None  # unknown, not an empty cache
    assert parse_metrics(page, "tgi", 0.0, kv_capacity_tokens=12_000).kv_usage == pytest.approx(0.25)


def test_labels_with_escaped_quotes_and_commas():
    block = 'a="x,y",b="say \\"hi\\", ok",c="back\\\\slash",d="new\\nline",e="}"'
    assert parse_labels(block) == {
        "a": "x,y",
        "b": 'say "hi", ok',
        "c": "back\\slash",
        "d": "new\nline",
        "e": "}",
    }
    page = vllm_page().decode()
    models = [parse_labels(s.labels)["model_name"] for s in find_samples(page, "vllm:num_requests_waiting")]
    assert AWKWARD_MODEL in models


def test_exact_names_only_and_comments_ignored():
    text = (
        "# HELP vllm:num_requests_waiting x\n"
        "vllm:num_requests_waiting_total 99\n"
        "vllm:num_requests_waiting 2\n"
        "vllm:num_requests_running 1 1700000000000\n"
        "vllm:kv_cache_usage_perc\t0.5\r\n"
    )
    m = parse_metrics(text, "vllm", 0.0)
    assert (m.waiting, m.running, m.kv_usage) == (2.0, 1.0, 0.5)


def test_old_vllm_cache_name_is_an_alias():
    m = parse_metrics("vllm:gpu_cache_usage_perc 0.7\nvllm:num_requests_waiting 0\n", "vllm", 0.0)
    assert m.kv_usage == 0.7


def test_unknown_dialect_is_value_error():
    with pytest.raises(ValueError, match="unknown metrics dialect 'ollama'"):
        parse_metrics("", "ollama", 0.0)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        b"\xff\xfe\x00garbage\x80",
        "<html><body>502 Bad Gateway</body></html>",
        'vllm:num_requests_waiting{model_name="x" 3\n',
        "vllm:num_requests_waiting abc\n",
        "vllm:num_requests_waiting 1 2 3\n",
        "vllm:num_requests_waiting\n",
        "vllm:num_requests_waiting NaN\n",
        'vllm:num_requests_running 1\nvllm:lora_requests_info{max_lora="4",running_lora_adapters="a} 1\n',
    ],
)
def test_garbage_raises_metrics_parse_error(garbage):
    with pytest.raises(MetricsParseError):
        parse_metrics(garbage, "vllm", 0.0)


def test_other_dialects_page_is_an_error_not_an_idle_pod():
    with pytest.raises(MetricsParseError, match="no sglang metrics"):
        parse_metrics(vllm_page(), "sglang", 0.0)


def test_insane_values_are_rejected_as_unknown_not_clamped():
    rejected: list[Rejection] = []
    page = "vllm:num_requests_waiting -3\nvllm:kv_cache_usage_perc 1.7\nvllm:num_requests_running 2\n"
    m = parse_metrics(page, "vllm", 0.0, rejected=rejected)
    assert (m.waiting, m.running, m.kv_usage) == (None, 2.0, None)
    assert {(r.field, r.reason) for r in rejected} == {("waiting", "negative"), ("kv_usage", "out_of_range")}


def test_kv_a_hair_outside_the_unit_interval_is_clamped():
    m = parse_metrics("vllm:kv_cache_usage_perc 1.004\nvllm:num_requests_waiting 0\n", "vllm", 0.0)
    assert m.kv_usage == 1.0


def test_the_config_names_exactly_the_parser_dialects() -> None:
    """gateway/config.py cannot import the EPP, so its `Engine` names are checked here."""
    import typing

    from gateway.pool_config import Engine

    assert set(typing.get_args(Engine)) == set(DIALECTS)
