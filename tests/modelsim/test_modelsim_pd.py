"""Disaggregated prefill/decode pods: a prefill-only request holds its KV until the decode pod
reads it (transfer time from the profile's link), then the decode pod decodes without
recomputing the prompt; the NIXL metrics vLLM publishes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from modelsim.fleet import Fleet, FleetSpec, SpecError, run_fleet
from modelsim.profiles import get_profile

PROMPT = {"model": "llama", "prompt": "tell me a long story " * 200}


@pytest.fixture
async def pd_fleet() -> AsyncIterator[Fleet]:
    spec = FleetSpec.from_dict(
        {
            "time_scale": 50.0,
            "pods": [
                {"name": "p", "model": "llama", "role": "prefill"},
                {"name": "d", "model": "llama", "role": "decode"},
            ],
        }
    )
    async with run_fleet(spec) as f:
        yield f


async def test_prefill_holds_kv_then_decode_reads_it(pd_fleet: Fleet) -> None:
    p, d = pd_fleet.pod("p"), pd_fleet.pod("d")
    async with httpx.AsyncClient(timeout=10) as c:
        first = await c.post(
            p.url + "/v1/completions",
            json={**PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}},
        )
        assert first.status_code == 200, first.text
        params = first.json()["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_port"] == p.port
        assert params["remote_block_ids"] and p.engine.held  # KV held for the transfer
        assert p.engine.kv_usage() > 0

        second = await c.post(
            d.url + "/v1/completions", json={**PROMPT, "max_tokens": 5, "kv_transfer_params": params}
        )
        assert second.status_code == 200, second.text
        assert second.json()["usage"]["completion_tokens"] == 5
        assert not p.engine.held and p.engine.kv_usage() == 0  # read, then freed
        stats = d.engine.stats
        prompt_tokens = second.json()["usage"]["prompt_tokens"]
        assert stats.external_prefix_cache_hits == prompt_tokens - 1  # the last one recomputed
        assert stats.nixl_xfer_time.count == 1 and stats.nixl_failed_transfers == 0
        expected = get_profile("h100-llama3.1-8b").kv_transfer_s(prompt_tokens)
        assert stats.nixl_xfer_time.sum == pytest.approx(expected)

        page = (await c.get(d.url + "/metrics")).text
        assert "vllm:nixl_xfer_time_seconds_count" in page
        assert "vllm:external_prefix_cache_hits_total" in page

        # The same params again: the KV is gone, the decode pod recomputes (vLLM's recompute policy).
        again = await c.post(
            d.url + "/v1/completions", json={**PROMPT, "max_tokens": 2, "kv_transfer_params": params}
        )
        assert again.status_code == 200
        assert stats.nixl_failed_transfers == 1


async def test_bad_transfer_params_are_400(pd_fleet: Fleet) -> None:
    url = pd_fleet.pod("d").url + "/v1/completions"
    async with httpx.AsyncClient(timeout=10) as c:
        for params in (
            "yes",
            {"do_remote_decode": "true"},
            {"do_remote_prefill": True},
            {
                "do_remote_prefill": True,
                "remote_host": "127.0.0.1",
                "remote_port": 0,
                "remote_request_id": "1",
            },
        ):
            r = await c.post(url, json={**PROMPT, "kv_transfer_params": params})
            assert r.status_code == 400 and "kv_transfer_params" in r.json()["error"]["message"]
        r = await c.post(
            url, json={**PROMPT, "stream": True, "kv_transfer_params": {"do_remote_decode": True}}
        )
        assert r.status_code == 400


def test_unknown_role_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="role"):
        FleetSpec.from_dict({"pods": [{"model": "m", "role": "prefiller"}]})
