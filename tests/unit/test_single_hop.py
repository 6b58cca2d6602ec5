"""The single-hop EPP's stream (epp/single_hop.py): route by model, pick in that pool, one reply."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from epp.datalayer.endpoint_records import Metrics
from epp.single_hop import SingleHopEpp, SingleHopProcessor, parse_metrics_ports
from extproc.errors import ErrorResponse
from extproc.headers import BASE_MODEL_HEADER, DESTINATION_HEADER, MODEL_HEADER
from extproc.stream import RequestRoute

LLAMA, QWEN = "127.0.0.1:1", "127.0.0.1:2"
CONFIG = {
    "pools": [
        {
            "name": "llama",
            "models": [{"name": "llama", "adapters": ["sql"]}],
            "endpoints": [{"address": LLAMA, "adapters": ["sql"]}],
        },
        {
            "name": "qwen",
            "models": [{"name": "qwen"}, {"name": "to-qwen", "rewrites": [{"model": "qwen", "weight": 1}]}],
            "endpoints": [{"address": QWEN}],
        },
    ]
}


@pytest.fixture
def epp(tmp_path: Path) -> SingleHopEpp:
    """Built outside an event loop, so no scraper starts: the tests feed pod state themselves."""
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    epp = SingleHopEpp(path)
    for app in epp.apps.values():
        for ep in app.pool.endpoints():
            app.pool.record_metrics(ep.address, Metrics(scraped_at=app.pool.snapshot().taken_at))
    return epp


def run(epp: SingleHopEpp, payload: bytes) -> tuple[SingleHopProcessor, RequestRoute | ErrorResponse]:
    proc = SingleHopProcessor(epp)
    return proc, asyncio.run(proc.on_request({}, payload))


def chat(model: str) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()


def inflight(epp: SingleHopEpp) -> dict[str, int]:
    return {name: app.pool.inflight_total() for name, app in epp.apps.items()}


def test_one_reply_carries_the_model_and_the_destination_and_keeps_the_body(epp: SingleHopEpp) -> None:
    proc, out = run(epp, chat("llama"))
    assert isinstance(out, RequestRoute), out
    assert out.set_headers[MODEL_HEADER] == "llama" and out.set_headers[DESTINATION_HEADER] == LLAMA
    assert out.metadata == {"envoy.lb": {DESTINATION_HEADER: LLAMA}}
    assert out.clear_route_cache and BASE_MODEL_HEADER not in out.set_headers
    assert out.body is None  # no rewrite: the body Envoy holds is forwarded as it came
    assert inflight(epp) == {"llama": 1, "qwen": 0}
    proc.on_response_headers({":status": "200"})
    proc.on_close(True)
    assert inflight(epp) == {"llama": 0, "qwen": 0}


def test_an_adapter_goes_to_its_base_models_pool(epp: SingleHopEpp) -> None:
    _, out = run(epp, chat("sql"))
    assert isinstance(out, RequestRoute), out
    assert out.set_headers[BASE_MODEL_HEADER] == "llama" and out.set_headers[DESTINATION_HEADER] == LLAMA


def test_a_rewrite_reserialises_the_body_and_routes_to_the_targets_pool(epp: SingleHopEpp) -> None:
    proc, out = run(epp, chat("to-qwen"))
    assert isinstance(out, RequestRoute), out
    assert out.set_headers[MODEL_HEADER] == "qwen" and out.set_headers[DESTINATION_HEADER] == QWEN
    assert out.body is not None and json.loads(out.body)["model"] == "qwen"
    assert inflight(epp) == {"llama": 0, "qwen": 1}
    proc.on_close(False)  # an abort returns the slot too
    assert inflight(epp) == {"llama": 0, "qwen": 0}


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b'{"model": 7}', 400, "invalid_model"),
        (chat("nope"), 404, "model_not_found"),
    ],
)
def test_refusals_are_openai_errors_and_hold_nothing(
    epp: SingleHopEpp, payload: bytes, status: int, code: str
) -> None:
    proc, out = run(epp, payload)
    assert isinstance(out, ErrorResponse) and (out.status, out.code) == (status, code)
    proc.on_close(False)
    assert inflight(epp) == {"llama": 0, "qwen": 0}


def test_no_body_is_left_to_envoys_own_404(epp: SingleHopEpp) -> None:
    _, out = run(epp, b"")
    assert out == RequestRoute(clear_route_cache=True)


def test_metrics_ports_are_pool_equals_port() -> None:
    assert parse_metrics_ports(["llama=9090", "qwen=9091"]) == {"llama": 9090, "qwen": 9091}
    with pytest.raises(ValueError, match="POOL=PORT"):
        parse_metrics_ports(["9090"])
