"""Our benchmark policies: the oracle's pick, the Envoy baseline bootstraps, runs through Envoy
(round-robin; epp-precise on a fleet publishing KV events and tokenizing with the shipped files)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
from pathlib import Path

import aiohttp
import httpx
import pytest
import yaml

from bench.__main__ import main, run_label
from bench.harness.baseline_envoy import render_baseline_bootstrap
from bench.harness.fleet import KV_EVENTS_FREE_PORTS, SHIPPED_TOKENIZER, FleetNeeds, fleet_with
from bench.harness.gateway_policies import (
    BEST_PROFILE,
    BEST_SCRAPE_MS,
    PRECISE_NEEDS,
    PRECISE_PROFILE,
    effective_epp_config,
    epp_config,
)
from bench.harness.loadgen import PROBE_HEADER
from bench.harness.oracle import OraclePicker, OracleProcessor, Probe, best_probe
from bench.harness.targets import fleet_needs, load_plugins
from devstack.certs import make_certs
from devstack.launch import envoy_binary, gateway_config_for
from extproc.errors import ErrorResponse
from gateway.config import parse_config
from gateway.profiles import BUILTIN_PROFILE_DATA
from modelsim.fleet import FleetSpec, run_fleet

MODEL = "llama3.1-8b"


def _chat(text: str, max_tokens: int = 8) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": False,
    }


def test_best_probe_takes_lowest_prediction_then_smaller_batch() -> None:
    probes = [Probe("a:1", 0.30, 0), Probe("b:1", 0.05, 9), Probe("c:1", 0.05, 2), Probe("d:1", 0.9, 0)]
    assert best_probe(probes) == probes[2]
    tied = [Probe("a:1", 0.1, 1), Probe("b:1", 0.1, 1)]
    assert {best_probe(tied, random.Random(s)).address for s in range(20)} == {"a:1", "b:1"}  # type: ignore[union-attr]
    assert best_probe([]) is None


async def _until_requests(client: httpx.AsyncClient, url: str, n: int, within: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        text = (await client.get(f"{url}/metrics")).text
        held = sum(
            float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
        )
        if held >= n:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{url} holds {held} of {n} requests"
        await asyncio.sleep(0.02)


async def test_oracle_picks_the_pod_with_lowest_predicted_ttft() -> None:
    spec = FleetSpec.from_dict(
        {
            "time_scale": 1.0,
            "pods": [{"name": "p", "model": MODEL, "profile": "a10g-llama3.1-8b", "replicas": 3}],
        }
    )
    async with run_fleet(spec) as fleet:
        pods = [{"model": p.model, "adapters": [], "address": p.address} for p in fleet.pods]
        config = parse_config(gateway_config_for(pods, {}))
        long_prompt = " ".join(f"word{i}" for i in range(3000))
        async with httpx.AsyncClient(timeout=30) as client, aiohttp.ClientSession() as session:
            picker = OraclePicker(config, config.pools[0].name, session)
            # Queue long prefills on pods 0 and 2 (A10G: ~1 s each), leave pod 1 idle.
            busy = [fleet.pods[0], fleet.pods[2]]
            tasks = [
                client.post(f"{p.url}/v1/chat/completions", json=_chat(long_prompt + str(i)))
                for p in busy
                for i in range(3)
            ]
            sent = [asyncio.ensure_future(t) for t in tasks]
            for p in busy:  # all three reached each busy pod (running or waiting there)
                await _until_requests(client, p.url, 3)
            body = json.dumps(_chat("hello there")).encode()
            probes = [await picker.probe(p["address"], body) for p in pods]
            assert all(p is not None for p in probes)
            # One call answers for the whole simulator process, as each pod would.
            together = await picker.probe_fleet(pods[2]["address"], body)
            assert sorted(together) == sorted(p["address"] for p in pods)
            assert min(together.values(), key=lambda p: p.predicted_ttft_s).address == fleet.pods[1].address
            picked = await picker.pick(MODEL, body)
            assert picked == fleet.pods[1].address
            assert min(probes, key=lambda p: p.predicted_ttft_s).address == picked  # type: ignore[union-attr]
            refused = await picker.pick("unknown-model", body)
            assert isinstance(refused, ErrorResponse) and refused.status == 404
            for task in sent:
                task.cancel()


@pytest.mark.parametrize("lb_policy", ["ROUND_ROBIN", "LEAST_REQUEST"])
@pytest.mark.parametrize("with_ext_proc", [False, True, "buffered"])
def test_baseline_bootstrap_passes_envoy_validate(
    tmp_path: Path, lb_policy: str, with_ext_proc: bool | str
) -> None:
    certs = make_certs(tmp_path / "certs")
    bootstrap = render_baseline_bootstrap(
        ["127.0.0.1:18001", "127.0.0.1:18002"],
        lb_policy,
        18443,
        18901,
        certs.server_cert,
        certs.server_key,
        ext_proc=("127.0.0.1", 19002) if with_ext_proc else None,
        response_body_mode="STREAMED" if with_ext_proc else "NONE",
        buffered_request_body=with_ext_proc == "buffered",
    )
    if with_ext_proc:
        hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        mode = hcm["http_filters"][0]["typed_config"]["processing_mode"]["request_body_mode"]
        assert mode == ("BUFFERED" if with_ext_proc == "buffered" else "FULL_DUPLEX_STREAMED")
    cluster = next(c for c in bootstrap["static_resources"]["clusters"] if c["name"] == "pods")
    assert cluster.get("lb_policy", "ROUND_ROBIN") == lb_policy  # ROUND_ROBIN, the default, is left out
    assert len(cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(bootstrap))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--use-dynamic-base-id"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_baseline_bootstrap_rejects_bad_input(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    with pytest.raises(ValueError, match="lb_policy"):
        render_baseline_bootstrap(["127.0.0.1:1"], "MAGLEVX", 1, 2, cert, key)
    with pytest.raises(ValueError, match="at least one pod"):
        render_baseline_bootstrap([], "ROUND_ROBIN", 1, 2, cert, key)
    with pytest.raises(ValueError, match="response_body_mode"):
        render_baseline_bootstrap(
            ["127.0.0.1:1"], "ROUND_ROBIN", 1, 2, cert, key, response_body_mode="BUFFERED"
        )
    with pytest.raises(ValueError, match="response_trailer_mode"):
        render_baseline_bootstrap(
            ["127.0.0.1:1"], "ROUND_ROBIN", 1, 2, cert, key, response_trailer_mode="BUFFERED"
        )


def test_epp_config_options() -> None:
    assert epp_config({}, None) == {}
    tuned = epp_config({"weights": '{"queue": 1}', "scrape_ms": "20"}, {"weights": {"queue": 5}})
    assert tuned["profiles"]["bench"]["weights"] == {"queue": 1}
    assert tuned["defaultProfile"] == "bench" and tuned["scrape"] == {"intervalMs": 20}
    assert epp_config({"profile": "chat"}, {"weights": {"queue": 5}})["defaultProfile"] == "chat"
    # epp-predicted: the built-in itself, or a copy of it with the overrides.
    predicted = BUILTIN_PROFILE_DATA["predicted"]
    assert epp_config({}, predicted, "predicted") == {"defaultProfile": "predicted"}
    assert epp_config({"scrape_ms": "20"}, predicted, "predicted")["defaultProfile"] == "predicted"
    override = epp_config({"weights": '{"predicted-ttft": 3, "prefix-cache": 1}'}, predicted, "predicted")
    assert override["defaultProfile"] == "bench"
    assert override["profiles"]["bench"]["weights"] == {"predicted-ttft": 3, "prefix-cache": 1}


def test_round_robin_run_through_real_envoy_has_no_errors(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "seed": 5,
                "fleet": {
                    "time_scale": 10.0,
                    "pods": [{"model": MODEL, "profile": "h100-llama3.1-8b", "replicas": 2}],
                },
                "workload": {"kind": "chat", "model": MODEL},
                "arrivals": {"pattern": "poisson", "rate": 20},
                "duration_s": 2,
            }
        )
    )
    results, summaries = tmp_path / "results", tmp_path / "summaries"
    code = main(
        ["run", "--scenario", str(scenario), "--policy", "round-robin", "--results", str(results),
         "--summaries", str(summaries), "--seed", "5", "--no-progress", "--max-requests", "24",
         "--max-wall-s", "60"]
    )  # fmt: skip
    assert code == 0
    summary = json.loads((results / "quick" / "tiny" / "round-robin" / "seed-5.json").read_text())["summary"]
    assert summary["requests"] >= 20
    assert summary["ok"] == summary["requests"]
    assert len(summary["pods"]) == 2  # round-robin used both pods
    recorded = json.loads((summaries / "quick" / "tiny" / "round-robin" / "seed-5.json").read_text())
    assert recorded["policy"]["config"] == {
        "kind": "envoy", "lb_policy": "ROUND_ROBIN", "envoy_concurrency": 1, "listener": "https",
    }  # fmt: skip
    assert recorded["seed_set"] == "other"


def test_effective_epp_config_resolves_the_default_and_tuned_profiles(tmp_path: Path) -> None:
    pods = [{"name": "p", "model": MODEL, "address": "127.0.0.1:1"}]
    for extra, weights in ((epp_config({}, None), {"predicted-ttft": 5.0, "precise-prefix-cache": 2.0, "kv-cache": 1.0}),
                           (epp_config({}, BUILTIN_PROFILE_DATA["gie"], "gie"),
                            {"queue": 2.0, "kv-cache": 2.0, "prefix-cache": 3.0}),
                           (epp_config({}, BEST_PROFILE), BEST_PROFILE["weights"]),
                           (epp_config({}, BUILTIN_PROFILE_DATA["predicted"], "predicted"),
                            BUILTIN_PROFILE_DATA["predicted"]["weights"])):  # fmt: skip
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(gateway_config_for(pods, {"llama3-1-8b": 1}, extra)))
        config = effective_epp_config(path)
        assert config["profile"]["weights"] == weights
        assert config["scrape"]["intervalMs"] == BEST_SCRAPE_MS
        json.dumps(config)  # JSON-ready for the summary


async def test_oracle_returns_its_probe_time_on_the_response() -> None:
    class SlowPicker:
        config = parse_config(gateway_config_for([{"model": MODEL, "address": "127.0.0.1:1"}], {}))

        async def pick(self, model: str, body: bytes) -> str:
            await asyncio.sleep(0.05)
            return "127.0.0.1:1"

    processor = OracleProcessor(SlowPicker())  # type: ignore[arg-type]
    assert processor.on_response_headers({":status": "200"}) is None  # nothing probed yet
    route = await processor.on_request({}, json.dumps(_chat("hi")).encode())
    assert route.set_headers == {"x-gateway-destination-endpoint": "127.0.0.1:1"}  # type: ignore[union-attr]
    probe = float(processor.on_response_headers({":status": "200"})[PROBE_HEADER])  # type: ignore[index]
    assert 0.05 <= probe < 30


def test_precise_policies_ask_the_fleet_for_events_and_tokenizer() -> None:
    load_plugins()
    assert PRECISE_PROFILE["weights"] == {
        **{k: v for k, v in BEST_PROFILE["weights"].items() if k != "prefix-cache"},
        "precise-prefix-cache": BEST_PROFILE["weights"]["prefix-cache"],
    }
    assert fleet_needs(["epp-best"]) == FleetNeeds()
    assert fleet_needs(["epp-predicted-precise"]) == PRECISE_NEEDS == FleetNeeds(True, True)
    # One fleet for the whole run: epp-best beside epp-precise tokenizes the same way, and its
    # summaries say so in their label.
    needs = fleet_needs(["epp-best", "epp-precise"])
    assert needs == PRECISE_NEEDS
    assert (run_label("epp-best", needs), run_label("epp-precise", needs)) == ("epp-best+tok", "epp-precise")
    assert run_label("epp-best", FleetNeeds(kv_events=True)) == "epp-best"
    pods: list[dict[str, object]] = [{"model": MODEL, "replicas": 2}, {"model": MODEL, "tokenizer": "x"}]
    spec = {"time_scale": 2.0, "pods": pods}
    out = fleet_with(spec, needs)
    assert out["pods"][0] == {
        "model": MODEL,
        "replicas": 2,
        "kv_events": KV_EVENTS_FREE_PORTS,
        "tokenizer": SHIPPED_TOKENIZER,
    }
    assert out["pods"][1]["tokenizer"] == "x"  # a pod's own setting stays
    assert pods[0] == {"model": MODEL, "replicas": 2}  # the scenario's spec is not changed
    assert fleet_with(spec, FleetNeeds()) == spec


def test_epp_precise_run_scores_by_the_pods_kv_events(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny-prefix.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "seed": 7,
                "fleet": {
                    "time_scale": 10.0,
                    "pods": [{"model": MODEL, "profile": "h100-llama3.1-8b", "replicas": 2}],
                },
                "workload": {
                    "kind": "shared_prefix", "model": MODEL, "groups": 4, "prompts_per_group": 6,
                    "system_tokens": 300, "question_tokens": 30, "output_tokens": 16,
                },
                "arrivals": {"pattern": "poisson", "rate": 20},
                "duration_s": 3,
            }
        )
    )  # fmt: skip
    results, summaries = tmp_path / "results", tmp_path / "summaries"
    code = main(
        ["run", "--scenario", str(scenario), "--policy", "epp-precise", "--results", str(results),
         "--summaries", str(summaries), "--seed", "7", "--no-progress", "--max-requests", "36",
         "--max-wall-s", "60"]
    )  # fmt: skip
    assert code == 0
    raw = json.loads((results / "quick" / "tiny-prefix" / "epp-precise" / "seed-7.json").read_text())
    assert raw["summary"]["requests"] >= 30
    assert raw["summary"]["ok"] == raw["summary"]["requests"]
    recorded = json.loads((summaries / "quick" / "tiny-prefix" / "epp-precise" / "seed-7.json").read_text())
    config = recorded["policy"]["config"]
    assert config["profile"]["weights"] == PRECISE_PROFILE["weights"]
    assert config["tokenizers"] == {MODEL: "modelsim/tokenizer_files/sim-llama3-12k"}
    assert config["kv_events"] == {"endpoints": 2, "with_events_port": 2, "with_replay_port": 2}
    # /debug/pool as the run ended: both pods scored by their own KV events.
    assert config["prefix_scoring_at_end"]["pods_by_mode"] == {"precise": 2}
    assert config["prefix_scoring_at_end"]["kv_blocks"] > 0
    assert recorded["run"]["fleet_options"] == {
        "kv_events": True,
        "tokenizer": True,
        "tokenizer_name": SHIPPED_TOKENIZER,
    }


def test_the_slo_policies_differ_only_in_trust_and_both_let_any_caller_shed_its_batch() -> None:
    """bench/harness/slo_policies.py: epp-default and epp-slo run one configuration, the batch
    class's `sheddable` objective open to untrusted callers (modelDefaults), so only the
    objective header's honouring differs."""
    from bench.harness.slo_policies import VIRTUAL_POLICIES
    from epp.requestcontrol.header_policy import HeaderPolicy

    pods = [{"model": MODEL, "adapters": [], "address": "127.0.0.1:1"}]
    parsed = {
        name: parse_config(gateway_config_for(pods, {}, extra)) for name, extra in VIRTUAL_POLICIES.items()
    }
    slo, default = parsed["epp-slo"], parsed["epp-default"]
    assert slo.model_dump(exclude={"listener"}) == default.model_dump(exclude={"listener"})
    asked = {"x-gateway-inference-objective": "sheddable", "x-gateway-slo-ttft-ms": "80"}
    for config in (slo, default):
        assert HeaderPolicy.from_config(config).objective(asked, MODEL).priority == -1
    assert HeaderPolicy.from_config(slo).slo_ttft_s(asked, "sheddable") == 0.08
    assert HeaderPolicy.from_config(default).slo_ttft_s(asked, "sheddable") is None
