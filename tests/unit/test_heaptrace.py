"""The services' opt-in tracemalloc sampling (gateway.heaptrace via the shared service CLI)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import tracemalloc
from pathlib import Path

import pytest

from gateway import heaptrace
from gateway.service_cli import run_service, service_parser


def _parse(*argv: str) -> argparse.Namespace:
    return service_parser("bbr", "test", default_port=0).parse_args(["--config", "unused.yaml", *argv])


def _records(directory: Path) -> list[dict]:
    return [json.loads(line) for p in directory.glob("*.jsonl") for line in p.read_text().splitlines()]


async def _until(check, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def test_off_by_default_writes_nothing_and_does_not_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(heaptrace.ENV_DIR, raising=False)
    monkeypatch.chdir(tmp_path)
    args = _parse()
    assert args.tracemalloc_dir is None
    seen: list[bool] = []

    async def serve(_: argparse.Namespace) -> None:
        seen.append(tracemalloc.is_tracing())

    run_service(serve, args)
    assert seen == [False]
    assert list(tmp_path.rglob("*")) == []


def test_on_writes_baseline_samples_and_final(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "trace"
    # The environment route is how launched children (the soak's) get it.
    monkeypatch.setenv(heaptrace.ENV_DIR, str(out))
    args = _parse("--tracemalloc-warmup-s", "0", "--tracemalloc-interval-s", "0.05")
    kept: list[bytes] = []

    async def serve(_: argparse.Namespace) -> None:
        assert tracemalloc.is_tracing()
        await _until(lambda: any(r["kind"] == "baseline" for r in _records(out)))
        kept.extend(b"x" * 1000 + bytes([i % 256]) for i in range(2000))  # ~2 MB that stays alive
        await _until(lambda: any(r["kind"] == "sample" for r in _records(out)))

    run_service(serve, args)
    assert not tracemalloc.is_tracing()
    [path] = out.glob("*.jsonl")
    assert path.name.startswith("bbr-")
    records = _records(out)
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "baseline" and kinds[-1] == "final" and "sample" in kinds
    final = records[-1]
    assert final["traced_kib"] > 0 and final["tracemalloc_overhead_kib"] > 0
    assert final["rss_kib"] >= final["rss_anon_kib"] > 0 and final["malloc_in_use_kib"] > 0
    top = final["top"][0]
    assert top["where"].split(":")[0].endswith("test_heaptrace.py")  # the growth is found where it is
    assert top["size_diff_kib"] > 1500 and top["count_diff"] >= 2000


def test_environment_turns_on_only_the_named_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(heaptrace.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(heaptrace.ENV_PROGS, "epp")
    assert _parse().tracemalloc_dir is None
    monkeypatch.setenv(heaptrace.ENV_PROGS, "epp,bbr")
    assert _parse().tracemalloc_dir == tmp_path
