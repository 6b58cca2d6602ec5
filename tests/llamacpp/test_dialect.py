"""The llamacpp metric dialect on pages captured from the real llama-server.

pages/busy.prom and pages/idle.prom are the `/metrics` of the server `make llama-server` builds
(llama.cpp 0c1e570 from the llama-cpp-python 0.3.36 sdist, the generated tiny model, `-np 2
--metrics`), fetched 0.4 s after five 1,500-token completions were sent at once (two slots
busy prefilling, three requests deferred) and after they all finished. The live page is parsed
in tests/llamacpp/test_live.py where the engine is built.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.micro.metric_pages import vllm_page
from devstack.llamacpp.model import MODEL_NAME
from epp.datalayer.endpoint_records import Endpoint, EndpointState, Metrics
from epp.datalayer.metric_dialects import DIALECTS, parse_metrics
from epp.datalayer.metric_lines import MetricsParseError, collect_samples
from epp.datalayer.pool import Pool
from epp.datalayer.prefill_pace import PrefillTotals, PrefillTracker, prefill_metric_names, prefill_totals
from epp.datalayer.scrape import Scraper, SpeedTracker
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import ScoringContext
from epp.scheduling.ttft_prediction import predicted_ttft

PAGES = Path(__file__).resolve().parent / "pages"


def _page(name: str) -> bytes:
    return (PAGES / name).read_bytes()


def _reference(page: bytes, name: str) -> float:
    """The value prometheus_client's own parser reads for the gauge `name`."""
    for family in text_string_to_metric_families(page.decode()):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not on the page")


@pytest.mark.parametrize(
    ("page", "waiting", "running"),
    [("busy.prom", 3.0, 2.0), ("idle.prom", 0.0, 0.0)],
)
def test_captured_page_gives_slots_busy_and_requests_deferred(page: str, waiting: float, running: float):
    text = _page(page)
    m = parse_metrics(text, "llamacpp", scraped_at=7.0)
    assert (m.waiting, m.running) == (waiting, running)
    assert m.waiting == _reference(text, "llamacpp:requests_deferred")
    assert m.running == _reference(text, "llamacpp:requests_processing")
    # No KV gauge on llama.cpp's page: unknown, never "empty".
    assert m.kv_usage is None
    assert (m.running_adapters, m.max_lora, m.block_size, m.num_gpu_blocks) == (frozenset(), 0, None, None)
    assert m.scraped_at == 7.0


def test_the_dialect_reads_only_names_the_real_page_has():
    names = {f.name for f in text_string_to_metric_families(_page("busy.prom").decode())}
    assert set(DIALECTS["llamacpp"].wanted_names()) <= names


def test_another_engines_page_is_an_error_not_an_idle_pod():
    with pytest.raises(MetricsParseError, match="no llamacpp metrics"):
        parse_metrics(vllm_page(), "llamacpp", 0.0)
    with pytest.raises(MetricsParseError, match="no vllm metrics"):
        parse_metrics(_page("busy.prom"), "vllm", 0.0)


def test_insane_slot_count_is_rejected_not_used():
    text = _page("busy.prom").replace(b"llamacpp:requests_deferred 3", b"llamacpp:requests_deferred NaN")
    rejected: list = []
    m = parse_metrics(text, "llamacpp", 0.0, rejected=rejected)
    assert (m.waiting, m.running) == (None, 2.0)
    assert [(r.field, r.reason) for r in rejected] == [("waiting", "non_finite")]


def _later(page: bytes, **counters: float) -> bytes:
    """The page with these `llamacpp:<name>` counters raised by the given amounts."""
    lines = []
    for line in page.decode().splitlines():
        name, _, value = line.partition(" ")
        key = name.removeprefix("llamacpp:")
        if not line.startswith("#") and key in counters:
            line = f"{name} {float(value) + counters[key]}"
        lines.append(line)
    return ("\n".join(lines) + "\n").encode()


def test_prefill_pace_from_the_prompt_counters():
    """Between the two captured pages 5,228 prompt tokens were computed in 0.80 s of prefill
    steps and 4 came from a slot's cache: ~6,547 tokens/s; no request count, no typical prompt."""
    names = prefill_metric_names("llamacpp")
    busy = prefill_totals(collect_samples(_page("busy.prom"), names, lenient=names), "llamacpp")
    idle = prefill_totals(collect_samples(_page("idle.prom"), names, lenient=names), "llamacpp")
    assert busy == PrefillTotals(None, 0.272483, 2048.0, 2048.0)
    assert idle == PrefillTotals(None, 1.07106, 7280.0, 7276.0)
    tracker = PrefillTracker()
    assert tracker.sample(busy, now=0.0) is None  # the baseline
    sample = tracker.sample(idle, now=10.0)
    assert sample is not None
    assert sample.tokens_per_s == pytest.approx(5228 / (1.07106 - 0.272483))
    assert sample.uncached_fraction == pytest.approx(5228 / 5232)
    assert sample.mean_prompt_tokens is None


async def test_scrapes_give_the_pool_a_tpot_and_a_prefill_pace():
    """The scraper's own path (record_page) over the captured page and a later one: the mean
    time per output token of the slots finished between them, and the prefill pace."""
    now = [100.0]
    pool = Pool(
        [Endpoint("127.0.0.1:8080", frozenset({MODEL_NAME}), engine="llamacpp")], clock=lambda: now[0]
    )
    scraper = Scraper(pool)
    ep = pool.endpoints()[0]
    speed = SpeedTracker()
    speed.prefill = PrefillTracker(interval_s=0.0)  # read the prefill series on every scrape
    idle = _page("idle.prom")
    later = _later(idle, tokens_predicted_total=400, tokens_predicted_seconds_total=2.0)
    later = _later(later, prompt_tokens_total=3000, prompt_seconds_total=0.5, prompt_tokens_cached_total=1000)
    for page in (idle, later):  # one second apart: more than the 0.5 s of prefill between them
        scraper.record_page(ep, page, speed, sent_at=now[0])
        now[0] += 1.0
    state = pool.snapshot().by_address()[ep.address]
    assert state.metrics is not None and (state.metrics.waiting, state.metrics.running) == (0, 0)
    assert state.tpot_ewma == pytest.approx(2.0 / 400)
    assert state.ttft_ewma is None  # llama.cpp exports nothing for it
    assert state.prefill_tps == pytest.approx(3000 / 0.5)
    assert state.uncached_fraction == pytest.approx(0.75)
    assert state.mean_prompt_tokens is None
    await scraper.stop()


def _llama_pod(address: str, running: float) -> EndpointState:
    """A llama-server pod as the scheduler sees it: KV unknown (the page has no KV gauge)."""
    metrics = Metrics(waiting=0.0, running=running, kv_usage=None)
    endpoint = Endpoint(address, frozenset({MODEL_NAME}), engine="llamacpp")
    return EndpointState(endpoint=endpoint, metrics=metrics, metrics_age=0.01, tpot_ewma=0.004)


def test_predicted_ttft_prefers_the_idle_llama_server():
    """An unknown KV usage would read as a full cache on vLLM (a wait for a running request to
    end, shorter the more are running) and favour the busier pod; llama.cpp exports no KV
    measure and admits by free slots, so that term is not applied to it."""
    idle, busy = _llama_pod("10.0.0.1:8080", 0.0), _llama_pod("10.0.0.2:8080", 1.0)
    request = InferenceRequest(
        request_id="r",
        model=MODEL_NAME,
        target_model=MODEL_NAME,
        adapter=None,
        prompt="hello " * 100,
        prompt_tokens=150,
        max_tokens=200,
    )
    scores = predicted_ttft(request, [busy, idle], ScoringContext())
    assert scores[1] == 1.0 and scores[0] <= scores[1]
