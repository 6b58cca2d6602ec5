"""The gateway-overhead table (bench/micro/overhead_gateway.py) carries both full-gateway modes, each
in both request body modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.micro.overhead_gateway import FULL_GATEWAYS, Cell, agentic_bodies, ext_proc_message_counts, render
from bench.reports.report import write_section


def test_both_modes_get_rows_added_against_direct(tmp_path: Path) -> None:
    names = ["direct to stub (no proxy)", *(name for name, *_ in FULL_GATEWAYS)]
    cells = [
        Cell(name, 1, 1024, 10, 0, 1.0 + i, 2.0 + i, 100.0, None if i == 0 else 2.5)
        for i, name in enumerate(names)
    ]
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    write_section(
        str(doc), "gateway-overhead", render(cells, [], "python -m bench.micro.overhead_gateway", "1.0 / 1.0")
    )
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in doc.read_text().splitlines()
        if line.startswith("| ")
    }
    single = rows["full gateway single-hop (Envoy + one EPP)"]
    assert "| +3.00 | +3.00 |" in single and "| 400 |" in single  # added vs direct; 1 s / 2.5 ms
    assert "| +1.00 | +1.00 |" in rows["full gateway (Envoy + BBR + EPP)"]
    assert "| +2.00 | +2.00 |" in rows["full gateway, buffered (Envoy + BBR + EPP)"]
    assert "| +4.00 | +4.00 |" in rows["full gateway single-hop, buffered (Envoy + one EPP)"]
    assert {mode for *_, mode in FULL_GATEWAYS} == {"streamed", "buffered"}


def test_message_counts_sum_every_ext_proc_filter() -> None:
    stats = (
        "http.gateway.ext_proc.stream_msgs_sent: 6\n"
        "http.gateway.ext_proc.stream_msgs_received: 5\n"
        "http.other.ext_proc.stream_msgs_sent: 4\n"
        "http.gateway.ext_proc.spurious_msgs_received: 9\n"
    )
    assert ext_proc_message_counts(stats) == {"sent": 10, "received": 5}


@pytest.mark.parametrize("size", [64 * 1024, 400 * 1024])
def test_agentic_bodies_are_sized_conversations_new_at_the_tail_or_throughout(size: int) -> None:
    turns = [json.loads(b) for b in agentic_bodies(size, 4, 3, fresh=False)]
    fresh = [json.loads(b) for b in agentic_bodies(size, 4, 3, fresh=True)]
    for bodies in (turns, fresh):
        for raw in bodies:
            assert 0.97 * size <= len(json.dumps(raw)) <= 1.03 * size
            roles = [m["role"] for m in raw["messages"]]
            assert roles[0] == "system" and roles[-1] == "user" and len(roles) > 4
    # A session's next turn: the same history, a new last message; a fresh session: nothing shared.
    assert turns[0]["messages"][:-1] == turns[1]["messages"][:-1] != fresh[0]["messages"][:-1]
    assert turns[0]["messages"][-1] != turns[1]["messages"][-1]
    assert not {m["content"] for m in fresh[0]["messages"]} & {m["content"] for m in fresh[1]["messages"]}
