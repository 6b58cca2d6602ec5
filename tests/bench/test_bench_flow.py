"""The flow-control and session-affinity benchmark pieces: workload headers and per-tag stats."""

from __future__ import annotations

from collections import Counter

from bench.harness.loadgen import RequestResult
from bench.harness.stats import by_tag, group_stickiness, session_stickiness
from bench.harness.workloads import generate_trace


def test_priority_tenants_tags_and_headers_follow_the_fractions() -> None:
    workload = {"kind": "priority_tenants", "model": "m", "critical_fraction": 0.1, "sheddable_fraction": 0.3,
                "heavy_share": 0.8}  # fmt: skip
    trace = generate_trace(workload, {"pattern": "poisson", "rate": 100}, 20, seed=1)
    classes = Counter(r.tag.split("/")[0] for r in trace)
    tenants = Counter(r.tag.split("/")[1] for r in trace)
    n = len(trace)
    assert abs(classes["critical"] / n - 0.1) < 0.03 and abs(classes["sheddable"] / n - 0.3) < 0.04
    assert abs(tenants["heavy"] / n - 0.8) < 0.04
    for r in trace:
        cls, tenant = r.tag.split("/")
        assert r.headers["x-gateway-tenant"] == tenant
        assert r.headers.get("x-gateway-inference-objective") == (None if cls == "standard" else cls)


def test_sessions_carry_their_session_header_when_asked() -> None:
    workload = {"kind": "sessions", "model": "m", "sessions": 4, "turns": 3, "session_header": True}
    trace = generate_trace(workload, {"pattern": "poisson", "rate": 10}, 5, seed=2)
    assert all(r.headers["x-session-id"] == r.tag.split("/")[0] for r in trace)


def result(i: int, tag: str, pod: str, status: int = 200) -> RequestResult:
    return RequestResult(i, tag, float(i), sent_s=float(i), ttft_s=0.1, e2e_s=1.0, status=status, pod=pod,
                         output_tokens=5)  # fmt: skip


def test_by_tag_counts_refusals_and_tokens_and_stickiness_counts_pod_changes() -> None:
    rs = [
        result(0, "critical/a", "p0"),
        result(1, "sheddable/a", "p0", status=429),
        result(2, "critical/a", "p1"),
    ]
    tags = by_tag(rs)
    assert tags["critical/a"]["ok"] == 2 and tags["critical/a"]["output_tokens"] == 10
    assert tags["sheddable/a"]["refused_429"] == 1
    assert by_tag([result(i, f"t{i}", "p") for i in range(20)]) == {}
    turns = [result(0, "session-1/turn-0", "p0"), result(1, "session-1/turn-1", "p0"),
             result(2, "session-1/turn-2", "p1"), result(3, "session-2/turn-0", "p1")]  # fmt: skip
    assert session_stickiness(turns) == 0.5
    assert session_stickiness(rs) is None
    assert group_stickiness(turns) is None
    groups = [result(0, "group-1", "p0"), result(1, "group-2", "p1"), result(2, "group-1", "p0"),
              result(3, "group-1", "p1", status=500), result(4, "group-1", "p2"),
              result(5, "group-1", "p2")]  # fmt: skip
    assert group_stickiness(groups) == 2 / 3  # p0 -> p0 kept, p0 -> p2 moved, p2 -> p2 kept
