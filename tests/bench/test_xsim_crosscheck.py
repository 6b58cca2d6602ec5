"""The xpyd-sim cross-check's pure parts: the trace and the knob mapping (no xpyd-sim needed)."""

from __future__ import annotations

import importlib.util

import pytest

from bench.harness.loadgen import RequestResult
from bench.probes.xsim_crosscheck import (
    LEVELS,
    MODEL,
    Knobs,
    Workload,
    make_trace,
    modelsim_fleet_spec,
    side_stats,
    xpyd_command,
    xpyd_profile,
)
from modelsim.fleet import FleetSpec


def test_the_trace_is_seeded_and_within_the_configured_lengths() -> None:
    w = Workload(requests=50, rate=10.0, seed=3, prompt_tokens=(5, 9), output_tokens=(2, 4))
    trace = make_trace(w, vocab_size=100)
    assert trace == make_trace(w, vocab_size=100)
    assert trace != make_trace(Workload(requests=50, rate=10.0, seed=4), vocab_size=100)
    assert len(trace) == 50
    assert [r.at_s for r in trace] == sorted(r.at_s for r in trace)
    for r in trace:
        assert 5 <= len(r.body["prompt"]) <= 9 and all(0 < t < 100 for t in r.body["prompt"])
        assert 2 <= r.body["max_tokens"] <= 4
        assert r.body["ignore_eos"] is True and r.body["stream"] is True and r.body["model"] == MODEL


def test_every_level_fits_both_simulators_limits() -> None:
    knobs = Knobs()
    for w in LEVELS.values():
        # xpyd-sim never runs a prompt larger than its prefill budget (no chunking).
        assert w.prompt_tokens[1] <= knobs.max_num_batched_tokens
        assert w.prompt_tokens[1] + w.output_tokens[1] < knobs.max_model_len


def _modelsim_step_ms(knobs: Knobs, decode_batch: int, mean_context: int) -> float:
    spec = FleetSpec.from_dict(modelsim_fleet_spec(knobs))
    profile = spec.pod_config(spec.pods[0]).profile
    return profile.step_ms(0, decode_batch, decode_batch * mean_context, lora=False)


def _xpyd_decode_ms(coeffs: list[float], bs: int, ctx: int) -> float:
    c = coeffs
    return c[0] + c[1] * bs + c[2] * ctx + c[3] * bs * ctx + c[4] * bs**2 + c[5] * ctx**2


@pytest.mark.parametrize(("batch", "context"), [(1, 100), (8, 700), (32, 1500)])
def test_a_decode_step_costs_the_same_in_both(batch: int, context: int) -> None:
    knobs = Knobs()
    ours = _modelsim_step_ms(knobs, batch, context)
    theirs = _xpyd_decode_ms(xpyd_profile(knobs)["decode"]["coefficients"], batch, context)
    assert theirs == pytest.approx(ours)


def test_a_prefill_costs_t0_plus_c_p_per_token_in_both() -> None:
    knobs = Knobs()
    a, b = xpyd_profile(knobs)["prefill"]["coefficients"]  # numpy.polyval order: highest first
    spec = FleetSpec.from_dict(modelsim_fleet_spec(knobs))
    profile = spec.pod_config(spec.pods[0]).profile
    # A prefill-only step of 1000 tokens is compute-bound in modelsim (c_p x 1000 > W).
    assert a * 1000 + b == pytest.approx(profile.step_ms(1000, 0, 0, lora=False))


def test_the_modelsim_pod_never_runs_out_of_kv_and_caches_no_prefix() -> None:
    knobs = Knobs()
    spec = FleetSpec.from_dict(modelsim_fleet_spec(knobs))
    pod = spec.pods[0]
    profile = spec.pod_config(pod).profile
    assert pod.enable_prefix_caching is False
    assert profile.num_gpu_blocks * profile.block_size >= knobs.max_num_seqs * knobs.max_model_len
    assert (profile.max_num_seqs, profile.max_num_batched_tokens) == (knobs.max_num_seqs, 2048)


def test_the_xpyd_command_carries_the_same_limits() -> None:
    cmd = xpyd_command(Knobs(max_num_seqs=7, max_num_batched_tokens=999), 1234, "p.yaml")
    flags = dict(zip(cmd[::2], cmd[1::2], strict=False)) | dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert flags["--max-num-seqs"] == "7" and flags["--max-num-batched-tokens"] == "999"
    assert "--scheduling" in cmd and flags["--mode"] == "dual" and flags["--profile"] == "p.yaml"


def test_side_stats_takes_the_server_side_ttft_when_given() -> None:
    results = [RequestResult(i, "t", 0.0, ttft_s=1.0, e2e_s=2.0 + i, status=200) for i in range(3)]
    results.append(RequestResult(3, "t", 0.0, status=500, error="HTTP 500"))
    own = side_stats(results)
    assert (own["ok"], own["requests"], own["ttft_s"]["p50"], own["e2e_s"]["p50"]) == (3, 4, 1.0, 3.0)
    assert side_stats(results, [0.1, 0.2, 0.3])["ttft_s"]["p50"] == 0.2


@pytest.mark.skipif(
    importlib.util.find_spec("xpyd_sim") is None, reason="xpyd-sim (bench extra) not installed"
)
def test_xpyd_sim_reads_the_profile_as_mapped(tmp_path) -> None:
    import yaml
    from xpyd_sim.profile import LatencyProfile  # type: ignore[import-untyped]

    knobs = Knobs()
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(xpyd_profile(knobs)))
    lp = LatencyProfile(str(path))
    assert lp.prefill_delay_ms(1000) == pytest.approx(knobs.t0_ms + knobs.c_p_ms_per_token * 1000)
    assert lp.decode_delay_per_token_ms(8, 700) == pytest.approx(_modelsim_step_ms(knobs, 8, 700))
