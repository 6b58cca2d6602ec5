"""vLLM's own KV-event publisher against a live EPP.

vllm/distributed/kv_events.py (ZmqEventPublisher, BlockStored, BlockRemoved, AllBlocksCleared,
KVEventBatch) and vllm/config/kv_events.py are loaded from the installed wheel as shipped. Their
imports of the rest of vLLM (which pull in torch) are replaced by stand-ins for the four names
they use: a logger, the config decorator (a dataclass), the block-hash type alias, and network
helpers used only for `tcp://*:0`. The EPP runs as its own process (`python -m epp`) with a
static pod whose kvEvents ports are the publisher's, and is read through its /debug/pool.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import yaml
import zmq

from devstack.engine_check.report import Check

BLOCK = 16  # tokens per block
POD = "127.0.0.1:{port}"


def _module(name: str, **attrs: Any) -> ModuleType:
    module = ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _unsupported(*_args: Any) -> Any:
    raise NotImplementedError("not used with the loopback endpoints of this check")


def load_vllm_kv_events(site: Path) -> ModuleType:
    """vllm.distributed.kv_events from `site` (a site-packages holding the vllm wheel)."""
    root = site / "vllm"
    for package in ("vllm", "vllm.distributed", "vllm.config", "vllm.utils", "vllm.v1", "vllm.v1.core"):
        # Packages without their __init__ (vllm/distributed/__init__.py imports torch).
        _module(package, __path__=[str(root.joinpath(*package.split(".")[1:]))])
    _module("vllm.logger", init_logger=logging.getLogger)
    _module("vllm.config.utils", config=dataclasses.dataclass)
    # vllm/v1/core/kv_cache_utils.py: `ExternalBlockHash: TypeAlias = bytes | int`.
    _module("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    _module(
        "vllm.utils.network_utils",
        get_ip=_unsupported,
        get_tcp_uri=_unsupported,
        is_valid_ipv6_address=_unsupported,
        split_zmq_path=_unsupported,
    )
    for name, path in (
        ("vllm.config.kv_events", root / "config" / "kv_events.py"),
        ("vllm.distributed.kv_events", root / "distributed" / "kv_events.py"),
    ):
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules["vllm.distributed.kv_events"]


class LossyLink:
    """Stands between vLLM's publisher thread and its PUB socket: the batches whose seq is in
    `drop` never reach the wire (as when a PUB high-water mark overflows), while vLLM's own
    replay buffer keeps them."""

    def __init__(self, sock: zmq.Socket[bytes]) -> None:
        self.sock = sock
        self.drop: set[int] = set()
        self.dropped: list[int] = []
        self.payloads: list[bytes] = []

    def send_multipart(self, frames: tuple[bytes, bytes, bytes]) -> None:
        seq = int.from_bytes(frames[1], "big")
        self.payloads.append(frames[2])
        if seq in self.drop:
            self.dropped.append(seq)
            return
        self.sock.send_multipart(frames)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _bound_port(sock: zmq.Socket[bytes]) -> int:
    return int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])


def _debug(metrics_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/debug/pool", timeout=5) as r:
        data: dict[str, Any] = json.load(r)
        return data


def _wait(
    what: str,
    read: Callable[[], dict[str, Any] | None],
    ok: Callable[[dict[str, Any]], bool],
    within: float = 30,
) -> dict[str, Any]:
    """Poll `read` until `ok` holds of it; AssertionError naming `what` and the last state."""
    deadline = time.monotonic() + within
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        try:
            last = read()
        except OSError:
            last = None
        if last is not None and ok(last):
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {within}s; last state {last}")


def _describe(payload: bytes) -> str:
    """The wire shape of one batch, read back with plain msgpack."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    events = batch[1] if isinstance(batch, list) else batch.get("events")
    first = events[0] if events else None
    shape = "array" if isinstance(batch, list) else "map"
    kind = (
        "tag-first array"
        if isinstance(first, list)
        else "map with 'type'"
        if isinstance(first, dict)
        else "-"
    )
    return f"batch as a msgpack {shape} of {len(batch)}, events as {kind}"


def run(site: Path, workdir: Path, check: Check) -> None:
    kv = load_vllm_kv_events(site)

    class LoopbackPublisher(kv.ZmqEventPublisher):  # type: ignore[name-defined]
        """vLLM's publisher binding the loopback endpoints it is given (vLLM binds wildcard
        and ipc endpoints, connects to the rest); nothing else differs."""

        @staticmethod
        def _is_bind_endpoint(endpoint: str) -> bool:
            return True

    publisher = LoopbackPublisher(
        0, endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", buffer_steps=8
    )
    link = LossyLink(publisher._pub)
    publisher._pub = link  # before the first publish; the thread reads it per batch
    pub_port, replay_port = _bound_port(link.sock), _bound_port(publisher._replay)
    check.saw(
        "vLLM's ZmqEventPublisher bound its PUB and ROUTER (replay, buffer_steps 8) sockets on loopback"
    )

    pod = POD.format(port=_free_port())  # no model server answers there: only the events matter
    metrics_port, grpc_port = _free_port(), _free_port()
    config = {
        "pools": [
            {
                "name": "check",
                "engine": "vllm",
                "kvEvents": {"replayPort": replay_port},
                "endpoints": [{"address": pod, "kvEventsPort": pub_port}],
                "models": [{"name": "m"}],
            }
        ]
    }
    (workdir / "epp.yaml").write_text(yaml.safe_dump(config))
    log = (workdir / "epp.log").open("w")
    epp = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "epp",
            "--config",
            str(workdir / "epp.yaml"),
            "--pool",
            "check",
            "--host",
            "127.0.0.1",
            "--port",
            str(grpc_port),
            "--metrics-port",
            str(metrics_port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def state() -> dict[str, Any] | None:
        pods: dict[str, Any] = _debug(metrics_port)["kv_events"]["pods"]
        return pods.get(pod)

    def publish(*events: Any) -> None:
        publisher.publish(kv.KVEventBatch(ts=time.time(), events=list(events)))

    def stored(hashes: list[int], parent: int | None) -> Any:
        return kv.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=list(range(BLOCK * len(hashes))),
            block_size=BLOCK,
            lora_id=None,
            medium=kv.MEDIUM_GPU,
            lora_name=None,
        )

    def expect(what: str, ok: Callable[[dict[str, Any]], bool], show: bool = True) -> dict[str, Any] | None:
        try:
            seen = _wait(what, state, ok)
        except AssertionError as err:
            check.expect(False, what, str(err))
            return None
        shown = f" (blocks {seen['blocks']}, last_seq {seen['last_seq']}, precise {seen['precise']})"
        check.expect(True, what + (shown if show else ""))
        return seen

    try:
        expect("the EPP subscribes to the pod", lambda s: s["running"], show=False)
        publish(stored([1, 2], None))
        expect(
            "BlockStored x2 (seq 0) indexed",
            lambda s: s["blocks"] == 2 and s["last_seq"] == 0 and s["precise"],
        )
        check.saw(f"wire: {_describe(link.payloads[0])}")
        publish(stored([3], 2))
        expect("a child BlockStored (seq 1) indexed", lambda s: s["blocks"] == 3 and s["last_seq"] == 1)
        publish(kv.BlockRemoved(block_hashes=[3], medium=kv.MEDIUM_GPU))
        expect("BlockRemoved (seq 2) applied", lambda s: s["blocks"] == 2 and s["last_seq"] == 2)
        publish(kv.AllBlocksCleared())
        expect("AllBlocksCleared (seq 3) applied", lambda s: s["blocks"] == 0 and s["last_seq"] == 3)
        resyncs = (state() or {}).get("resyncs")

        # A gap: seq 4 never reaches the subscriber; seq 5 does, and vLLM's replay serves 4.
        link.drop = {4}
        publish(stored([10], None))
        publish(stored([11], 10))
        seen = expect(
            "gap (seq 4 lost on the wire) replayed from vLLM's ROUTER buffer",
            lambda s: s["blocks"] == 2 and s["last_seq"] == 5,
        )
        check.expect(link.dropped == [4], "the live link dropped exactly seq 4", str(link.dropped))
        if seen is not None:
            check.expect(
                seen["resyncs"] == resyncs and seen["precise"], "no resync: the index stayed precise"
            )

        # A gap longer than vLLM's replay buffer (buffer_steps 8): the pod is resynced, then
        # precise again from the fresh events.
        link.drop = set(range(6, 18))
        for n in range(6, 18):
            publish(stored([100 + n], None))
        publish(stored([200], None))
        seen = expect(
            "gap of 12 beyond the 8-batch replay buffer: resynced, then precise on fresh events",
            lambda s: s["last_seq"] == 18 and s["resyncs"] == (resyncs or 0) + 1 and s["precise"],
        )
        if seen is not None:
            # After the resync the index holds what the buffer still had (seqs 11..18), not the lost ones.
            check.expect(
                seen["blocks"] == 8, "the buffer's tail (seqs 11-18) kept after the resync", str(seen)
            )
    finally:
        publisher.shutdown()
        epp.terminate()
        try:
            epp.wait(10)
        except subprocess.TimeoutExpired:
            epp.kill()
        log.close()
