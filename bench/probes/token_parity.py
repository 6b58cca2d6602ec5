"""Prompt tokens per tokenizer on the bench's own traces: is the tokenizing fleet's load the
scenarios' designed load?

    python -m bench.probes.token_parity [--seed 100] [--requests 300] [--tokenizer DIR] [--max-ratio 1.1]
        [--scenario bench/scenarios/shared-prefix.yaml ...]

Per scenario, the mean prompt tokens over the trace's first N requests three ways: the
workloads' target (the EPP's chars / 4 estimate of the prompt text, which is what
bench/harness/workloads.py sizes text by), modelsim's approximate word-piece ids (the usual fleet) and
the shipped real tokenizer (the tokenizing fleet of the precise policies, `--fleet-tokenizer`).
Exits 1 when a shipped / target ratio is off by more than `--max-ratio` either way, so a
rebuilt tokenizer (python -m modelsim.build_tokenizer) that stops matching the bench's text is
caught before a precise run is compared with the usual ones.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness.scenario import load_scenario
from epp.scheduling.request import CHARS_PER_TOKEN, prompt_text
from modelsim.build_tokenizer import OUT as SHIPPED_TOKENIZER_DIR
from modelsim.tokenizer import ApproxTokenizer, HFTokenizer, PromptTokenizer

SCENARIOS_DIR = Path(__file__).resolve().parents[1] / "scenarios"
DEFAULT_SCENARIOS = ("shared-prefix", "shared-prefix-long", "docqa", "mixed-gpu", "lora")
MAX_RATIO = 1.1
APPROX_VOCAB = 128256  # Llama 3's; the approximate ids' count does not depend on it


@dataclass(frozen=True)
class Parity:
    scenario: str
    requests: int
    target: float  # mean chars / 4 of the prompt text
    approx: float  # mean modelsim approximate ids
    shipped: float  # mean shipped-tokenizer ids

    @property
    def ratio(self) -> float:
        return self.shipped / self.target

    def line(self) -> str:
        return (
            f"{self.scenario:20s} requests={self.requests} target={self.target:,.0f}"
            f" approx={self.approx:,.0f} ({self.approx / self.target:.2f}x)"
            f" shipped={self.shipped:,.0f} ({self.ratio:.2f}x)"
        )


def measure(path: Path, seed: int, requests: int, shipped: PromptTokenizer) -> Parity:
    scenario = load_scenario(path).with_seed(seed)
    trace = scenario.trace()[:requests]
    approx = ApproxTokenizer(APPROX_VOCAB)
    target, approx_n, shipped_n = [], [], []
    for req in trace:
        messages = req.body["messages"]
        target.append(max(1, len(prompt_text(req.body)) // CHARS_PER_TOKEN))
        approx_n.append(len(approx.encode_chat(messages)))
        shipped_n.append(len(shipped.encode_chat(messages)))
    return Parity(
        scenario.name,
        len(trace),
        statistics.fmean(target),
        statistics.fmean(approx_n),
        statistics.fmean(shipped_n),
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.probes.token_parity", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--scenario", action="append", help="scenario YAML (repeatable); default: five")
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--tokenizer", default=str(SHIPPED_TOKENIZER_DIR), help="HF tokenizer folder")
    ap.add_argument("--max-ratio", type=float, default=MAX_RATIO)
    args = ap.parse_args(argv)
    paths = [Path(p) for p in args.scenario] if args.scenario else [
        SCENARIOS_DIR / f"{name}.yaml" for name in DEFAULT_SCENARIOS
    ]  # fmt: skip
    shipped = HFTokenizer(args.tokenizer)
    failed = False
    for path in paths:
        parity = measure(path, args.seed, args.requests, shipped)
        off = not 1 / args.max_ratio <= parity.ratio <= args.max_ratio
        failed = failed or off
        print(parity.line() + ("  OFF" if off else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
