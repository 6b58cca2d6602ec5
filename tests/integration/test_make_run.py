"""`make run` (`python -m devstack.run`) as a newcomer meets it: it says where its work directory
is, its live config shows the shipped default profile's weights as an editable `profiles:`
block, `/debug/pool` shows the profiles in force, and Ctrl-C removes the work directory."""

from __future__ import annotations

import queue
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic
import httpx
import httpx2
import yaml

from gateway.profiles import BUILTIN_PROFILES


def read_until(lines: queue.Queue[str], marker: str, within: float = 120.0) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + within
    while not any(marker in line for line in seen):
        try:
            seen.append(lines.get(timeout=max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(f"no {marker!r} within {within} s; output: {''.join(seen)}") from None
    return seen


def anthropic_client_works(output: str) -> None:
    """The official `anthropic` client through the gateway `make run` printed, streamed and not."""
    curl = re.search(r"curl --cacert (\S+) (\S+)/v1/chat/completions", output)
    assert curl is not None, output
    ca, url = curl.groups()
    with httpx2.Client(verify=ssl.create_default_context(cafile=ca), timeout=30) as http:
        client = anthropic.Anthropic(base_url=url, api_key="unused", http_client=http, max_retries=0)
        model = re.search(r"-d '\{\"model\": \"([^\"]+)\"", output).group(1)  # type: ignore[union-attr]
        messages: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Hello!"}]
        answer = client.messages.create(model=model, max_tokens=4, messages=messages)
        assert answer.type == "message" and answer.usage.output_tokens == 4
        with client.messages.stream(model=model, max_tokens=4, messages=messages) as stream:
            assert stream.get_final_message().usage.output_tokens == 4


def start_make_run(*args: str) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    """`python -m devstack.run --port 0 ARGS` (what `make run ARGS=...` runs) and its output's
    lines as they come (read with `read_until`)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack.run", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    stdout = proc.stdout
    assert stdout is not None

    def pump() -> None:
        for line in stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def test_make_run_names_its_workdir_shows_the_weights_and_removes_it_on_ctrl_c() -> None:
    proc, lines = start_make_run()
    try:
        output = "".join(read_until(lines, "Press Ctrl-C"))
        workdir = Path(re.search(r"^Work directory: (\S+) \(removed on exit", output, re.M).group(1))  # type: ignore[union-attr]
        assert workdir.is_dir()
        shipped = dict(BUILTIN_PROFILES["default"].weights)
        live = yaml.safe_load((workdir / "gateway.yaml").read_text())
        assert live["profiles"] == {"default": {"weights": shipped}}  # the code's default, editable
        # Every pool's `epp` names where its EPP listens (single-hop: the one EPP serving all).
        for pool_config in live["pools"]:
            epp = pool_config["epp"]
            with socket.create_connection((epp["host"], epp["port"]), timeout=5):
                pass
        assert len({p["epp"]["port"] for p in live["pools"]}) == 1
        debug_url = re.search(r"^Profiles and weights in force: (\S+?)[,\s]", output, re.M).group(1)  # type: ignore[union-attr]
        pool = httpx.get(debug_url, timeout=5).json()
        assert pool["default_profile"] == "default"
        assert pool["profiles"]["default"]["weights"] == shipped
        assert {"chat", "batch"} <= set(pool["profiles"])
        assert {ep["name"] for ep in pool["endpoints"]} <= {"llama-0", "llama-1", "qwen-0", "qwen-1"}
        anthropic_client_works(output)

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        assert not workdir.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
