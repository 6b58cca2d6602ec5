"""How often a policy sent requests of one burst to the same pod, read from raw run results
(`bench/results/...`, git-ignored): the signature of routers that decide a burst on the same
stale picture (several EPP replicas that do not see each other's picks yet).

    python -m bench.reports.herding bench/results/quick/shared-prefix [--window-ms 20]

prints one line per policy and seed: the pairs of requests sent to the same pod within the
window of each other, and how many requests sent earlier to the chosen pod had not produced
their first token yet when a request was sent (mean and P95: the queue it joined).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from bench.harness.loadgen import RequestResult
from bench.harness.stats import percentile

# Requests sent before this one that can still be ahead of it (a bound on the backward scan).
_LOOKBACK = 200


def herding(results: Sequence[RequestResult], window_s: float) -> tuple[int, float, float]:
    """(same-pod pairs within `window_s`, mean and P95 of earlier requests still before their
    first token on the chosen pod at send time)."""
    sent = sorted((r for r in results if r.ok and r.pod), key=lambda r: r.sent_s)
    pairs = 0
    ahead: list[int] = []
    for i, r in enumerate(sent):
        j = i - 1
        while j >= 0 and r.sent_s - sent[j].sent_s < window_s:
            pairs += sent[j].pod == r.pod
            j -= 1
        earlier = sent[max(0, i - _LOOKBACK) : i]
        ahead.append(sum(1 for s in earlier if s.pod == r.pod and s.sent_s + (s.ttft_s or 0.0) > r.sent_s))
    if not ahead:
        return 0, 0.0, 0.0
    return pairs, sum(ahead) / len(ahead), percentile(ahead, 95) or 0.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reports.herding", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("scenario_dir", type=Path, help="bench/results/<mode>/<scenario>")
    parser.add_argument("--window-ms", type=float, default=20.0, help="what counts as one burst (default 20)")
    args = parser.parse_args(argv)
    paths = sorted(args.scenario_dir.glob("*/seed-*.json"))
    if not paths:
        parser.error(f"no */seed-*.json under {args.scenario_dir}")
    for path in paths:
        results = [RequestResult(**r) for r in json.loads(path.read_text())["results"]]
        pairs, mean, p95 = herding(results, args.window_ms / 1000)
        print(
            f"{path.parent.name} {path.stem}: same-pod pairs within {args.window_ms:g} ms {pairs}, "
            f"requests ahead on the chosen pod mean {mean:.2f} P95 {p95:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
