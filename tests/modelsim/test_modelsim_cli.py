"""``python -m modelsim fleet``: ready file, serving, clean exit on SIGTERM; bad specs fail clearly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def test_fleet_cli_ready_file_and_sigterm(tmp_path: Path) -> None:
    spec = tmp_path / "fleet.yaml"
    spec.write_text("time_scale: 20\npods:\n  - {name: a, model: m, adapters: [m-x], replicas: 2}\n")
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelsim", "fleet", "--spec", str(spec), "--ready-file", str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert [p["name"] for p in info["pods"]] == ["a-0", "a-1"]
        assert info["pods"][0]["adapters"] == ["m-x"] and info["pods"][0]["dialect"] == "vllm"
        r = httpx.post(
            f"http://{info['pods'][1]['address']}/v1/completions", json={"prompt": "hi", "max_tokens": 2}
        )
        assert r.status_code == 200 and r.headers["x-modelsim-pod"] == "a-1"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_fleet_cli_rejects_bad_spec(tmp_path: Path) -> None:
    spec = tmp_path / "fleet.yaml"
    spec.write_text("pods:\n  - {model: m, profile: no-such-gpu}\n")
    out = subprocess.run(
        [sys.executable, "-m", "modelsim", "fleet", "--spec", str(spec)], capture_output=True, timeout=120
    )
    assert out.returncode == 2 and b"unknown profile" in out.stderr


def test_serve_cli_single_pod(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    args = ["serve", "--model", "m", "--port", "0", "--dialect", "sglang", "--time-scale", "20"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelsim", *args, "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        (pod,) = json.loads(ready.read_text())["pods"]
        assert pod["name"] == "m-0" and pod["dialect"] == "sglang"
        assert "sglang:num_queue_reqs" in httpx.get(f"http://{pod['address']}/metrics").text
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
