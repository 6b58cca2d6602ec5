"""The profile variants these summaries ran (`python -m bench sim --policy-module agentic_variants
--policy epp-default --policy epp-pfx5 ... --seeds tuning`, this folder on PYTHONPATH):
the default's weights with the prefix term heavier, or without kv-cache."""

from __future__ import annotations

from typing import Any


def _profile(weights: dict[str, float]) -> dict[str, Any]:
    return {"profiles": {"v": {"weights": weights}}, "defaultProfile": "v"}


VIRTUAL_POLICIES: dict[str, dict[str, Any]] = {
    "epp-pfx5": _profile({"predicted-ttft": 5, "precise-prefix-cache": 5, "kv-cache": 1}),
    "epp-pfx10": _profile({"predicted-ttft": 5, "precise-prefix-cache": 10, "kv-cache": 1}),
    "epp-nokv": _profile({"predicted-ttft": 5, "precise-prefix-cache": 2}),
}
