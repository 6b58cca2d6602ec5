"""Fleet specs (validation, replicas, custom profiles) and the /sim/probe oracle."""

from __future__ import annotations

import httpx
import pytest

from modelsim.fleet import Fleet, FleetSpec, SpecError, run_fleet


def test_spec_expands_replicas_and_custom_profiles() -> None:
    spec = FleetSpec.from_dict(
        {
            "time_scale": 5,
            "profiles": {"tiny": {"base": "a10g-llama3.1-8b", "num_gpu_blocks": 64, "max_num_seqs": 8}},
            "pods": [
                {"name": "a", "model": "m", "replicas": 3, "profile": "tiny", "max_loras": 2},
                {"name": "b", "model": "m", "profile": "h100x4-llama3.1-70b"},
            ],
        }
    )
    assert [p.name for p in spec.pods] == ["a-0", "a-1", "a-2", "b"]
    cfg = spec.pod_config(spec.pods[0])
    assert cfg.profile.num_gpu_blocks == 64 and cfg.profile.max_loras == 2
    assert cfg.profile.w_ms == spec.profiles["a10g-llama3.1-8b"].w_ms  # inherited from the base


@pytest.mark.parametrize(
    "data",
    [
        {"pods": []},
        {"pods": [{"model": "m", "profile": "nope"}]},
        {"pods": [{"model": "m", "dialect": "nope"}]},
        {"pods": [{"name": "x"}]},
        {"pods": [{"model": "m", "replicas": 0}]},
        {"pods": [{"model": "m", "port": "80"}]},
        {"pods": [{"model": "m", "bogus": 1}]},
        {"pods": [{"model": "m", "num_gpu_blocks": -1}]},
        {"pods": [{"name": "x", "model": "m"}, {"name": "x", "model": "m"}]},
        {"time_scale": 0, "pods": [{"model": "m"}]},
        {"profiles": {"p": {"base": "missing"}}, "pods": [{"model": "m"}]},
    ],
)
def test_spec_rejects_bad_input(data: dict) -> None:
    with pytest.raises(SpecError):
        FleetSpec.from_dict(data)


async def test_probe_reports_cache_and_prediction(fleet: Fleet) -> None:
    pod = fleet.pod("llama-0")
    body = {"model": "llama", "prompt": "a shared system prompt about databases " * 60, "max_tokens": 1}
    async with httpx.AsyncClient(base_url=pod.url) as c:
        cold = (await c.post("/sim/probe", json=body)).json()
        assert cold["cached_prefix_tokens"] == 0 and cold["waiting"] == 0 and cold["free_blocks"] == 28000
        assert cold["adapter_resident"] is None
        assert (await c.post("/v1/completions", json=body)).status_code == 200
        warm = (await c.post("/sim/probe", json=body)).json()
        sql = (await c.post("/sim/probe", json={**body, "model": "llama-sql"})).json()
        assert (await c.post("/sim/probe", json={"model": "zzz", "prompt": "x"})).status_code == 404
    assert warm["cached_prefix_tokens"] == (warm["prompt_tokens"] - 1) // 16 * 16
    assert warm["predicted_ttft_s"] < cold["predicted_ttft_s"]
    assert sql["cached_prefix_tokens"] == 0 and sql["adapter_resident"] is False  # adapter keys its own cache
    assert pod.probe([1, 2, 3])["running"] == 0


async def test_probe_fleet_answers_for_every_pod_of_the_process_that_serves_the_model(fleet: Fleet) -> None:
    body = {"model": "llama-sql", "prompt": "a shared system prompt about databases " * 60, "max_tokens": 1}
    async with httpx.AsyncClient(base_url=fleet.pod("qwen").url) as c:  # any pod of the process
        alone = (await c.post(f"{fleet.pod('llama-0').url}/sim/probe", json=body)).json()
        together = (await c.post("/sim/probe-fleet", json=body)).json()["pods"]
        qwen = (await c.post("/sim/probe-fleet", json={**body, "model": "qwen"})).json()["pods"]
        assert (await c.post("/sim/probe-fleet", json={"model": "zzz", "prompt": "x"})).status_code == 404
        assert (await c.post("/sim/probe-fleet", content=b"{")).status_code == 400
    assert list(together) == [fleet.pod("llama-0").address]  # the only pod serving the adapter
    mine = together[fleet.pod("llama-0").address]
    assert {k: mine[k] for k in ("prompt_tokens", "cached_prefix_tokens", "adapter_resident")} == {
        k: alone[k] for k in ("prompt_tokens", "cached_prefix_tokens", "adapter_resident")
    }
    assert list(qwen) == [fleet.pod("qwen").address]
    await fleet.pod("qwen").crash()
    async with httpx.AsyncClient(base_url=fleet.pod("llama-0").url) as c:
        assert (await c.post("/sim/probe-fleet", json={**body, "model": "qwen"})).status_code == 404


async def test_each_pod_serves_with_its_own_name() -> None:
    spec = FleetSpec.from_dict({"time_scale": 50, "pods": [{"name": "p", "model": "m", "replicas": 2}]})
    async with run_fleet(spec) as fleet:
        assert len({p.port for p in fleet.pods}) == 2
        for pod in fleet.pods:
            async with httpx.AsyncClient(base_url=pod.url) as c:
                r = await c.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
            assert r.headers["x-modelsim-pod"] == pod.name
        with pytest.raises(KeyError):
            fleet.pod("missing")
