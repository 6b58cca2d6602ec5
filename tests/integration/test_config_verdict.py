"""One verdict per configuration: BBR and every EPP validate the whole file with the same
schema, so a change is applied by all of them or rejected by all of them for the same reason,
the last good configuration kept everywhere, and each service's /metrics counts it.

The services run as the real processes (`python -m bbr`, `python -m epp`) on one file; no
Envoy is needed to read their verdicts.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from devstack.launch import free_port

VERDICT = re.compile(
    r"config from (?P<source>\S+) (?P<outcome>applied|rejected)(?:, keeping the last good one: (?P<reason>.*)|: .*)?$"
)


def wait_for(cond: Callable[[], bool], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def base_config() -> dict:
    return {
        "pools": [
            {
                "name": name,
                "models": [{"name": model}],
                "endpoints": [{"address": f"127.0.0.1:{free_port()}"}],
            }
            for name, model in (("pool-a", "model-a"), ("pool-b", "model-b"))
        ],
        "profiles": {"default": {"weights": {"queue": 1, "kv-cache": 1}}},
    }


class Service:
    def __init__(self, name: str, argv: list[str], log: Path, metrics_port: int) -> None:
        self.name, self.log, self.metrics_port = name, log, metrics_port
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def verdicts(self) -> list[dict[str, str | None]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            match = VERDICT.search(line)
            if match:
                out.append(match.groupdict())
        return out

    def metric(self, result: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).text
        match = re.search(rf'^gateway_config_reloads_total\{{result="{result}"\}} (\S+)$', text, re.M)
        return float(match.group(1)) if match else 0.0

    def up(self) -> bool:
        assert self.proc.poll() is None, f"{self.name} exited: {self.log.read_text()}"
        try:
            return httpx.get(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[Path, list[Service]]]:
    config_path = tmp_path / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(base_config(), sort_keys=False))
    common = ["--config", str(config_path), "--port", "0"]
    started: list[Service] = []
    try:
        port = free_port()
        started.append(
            Service(
                "bbr",
                [sys.executable, "-m", "bbr", *common, "--metrics-port", str(port)],
                tmp_path / "bbr.log",
                port,
            )
        )
        for pool in ("pool-a", "pool-b"):
            port = free_port()
            argv = [sys.executable, "-m", "epp", *common, "--pool", pool, "--metrics-port", str(port)]
            started.append(Service(f"epp-{pool}", argv, tmp_path / f"epp-{pool}.log", port))
        for service in started:
            wait_for(service.up, f"{service.name} up")
        yield config_path, started
    finally:
        for service in started:
            service.proc.terminate()
        for service in started:
            try:
                service.proc.wait(10)
            except subprocess.TimeoutExpired:
                service.proc.kill()


def offer(config_path: Path, services: list[Service], change: Callable[[dict], None]) -> list[dict]:
    """Write a changed config; return each service's verdict on it once all have one."""
    seen = {s.name: len(s.verdicts()) for s in services}
    config = base_config()
    change(config)
    # Atomically, as a ConfigMap update lands: a watcher polling mid-write (every 0.2 s) would
    # otherwise judge a truncated file first.
    staged = config_path.with_suffix(".staged")
    staged.write_text(yaml.safe_dump(config, sort_keys=False))
    staged.replace(config_path)
    wait_for(lambda: all(len(s.verdicts()) > seen[s.name] for s in services), "every service's verdict")
    return [s.verdicts()[-1] for s in services]


def test_bbr_and_every_epp_give_one_verdict_with_the_same_reason(
    services: tuple[Path, list[Service]],
) -> None:
    config_path, running = services
    # A negative weight: BBR applied this (it did not type the scheduling section), the EPPs rejected it.
    verdicts = offer(config_path, running, lambda c: c["profiles"]["default"]["weights"].update(queue=-1))
    assert [v["outcome"] for v in verdicts] == ["rejected"] * 3
    reasons = {v["reason"] for v in verdicts}
    assert len(reasons) == 1, verdicts
    assert "profiles.default.weights.queue" in reasons.pop()  # names the field
    assert [s.metric("rejected") for s in running] == [1.0, 1.0, 1.0]

    # A profile a model refers to but nobody defines: rejected alike too.
    verdicts = offer(config_path, running, lambda c: c["pools"][0]["models"][0].update(profile="nope"))
    assert [v["outcome"] for v in verdicts] == ["rejected"] * 3
    assert len({v["reason"] for v in verdicts}) == 1

    # A valid change is applied by all, and counted by each.
    verdicts = offer(config_path, running, lambda c: c["profiles"]["default"]["weights"].update(queue=3))
    assert [v["outcome"] for v in verdicts] == ["applied"] * 3
    assert [s.metric("applied") for s in running] == [1.0, 1.0, 1.0]
    assert all(s.proc.poll() is None for s in running)
