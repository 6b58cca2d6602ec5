"""The pages `bench report` writes: the glance table and figure, sections in the page that holds
them, and the committed pages and figure equal to what the committed summaries give."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.harness.gateway_policies import DEFAULT_REVISION
from bench.harness.loadgen import RequestResult
from bench.harness.scenario import parse_scenario
from bench.harness.summary import REPORTING_SEEDS, build_summary, load_summaries, write_summary
from bench.reports.headline import digest, figure_digest, headline_rows
from bench.reports.pages import FAMILIES, FIGURE, README, RESULTS, SCENARIOS, DocSet
from bench.reports.report import shipped_default, write_section

REPO = Path(__file__).parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _results(scale: float, n: int = 40) -> list[RequestResult]:
    return [
        RequestResult(i, "chat", i * 0.3, i * 0.3, 0.001, scale * (i + 1), scale * (i + 1) + 1, [0.01],
                      50, 50, 200, None, f"pod-{i % 2}")
        for i in range(n)
    ]  # fmt: skip


def _scenario(name: str):
    return parse_scenario(
        {
            "name": name,
            "description": f"{name} toy.",
            "fleet": {"pods": [{"model": "m", "profile": "h100-llama3.1-8b", "replicas": 2}]},
            "workload": {"kind": "chat", "model": "m"},
            "arrivals": {"pattern": "poisson", "rate": 2},
            "duration_s": 12,
        },
        "quick",
    )


def _write(root: Path, name: str, scales: dict[str, float], earlier: bool = False) -> None:
    """Summaries of `name`, each policy's TTFT proportional to its scale, +10 % per seed."""
    profile = shipped_default()
    if earlier:
        profile = {**profile, "weights": {"queue": 2, "kv-cache": 2, "prefix-cache": 3}}
    for k, seed in enumerate(REPORTING_SEEDS):
        for policy, scale in scales.items():
            config = (
                {"profile": profile, "default_revision": DEFAULT_REVISION} if policy == "epp-default" else {}
            )
            summary = build_summary(
                scenario=_scenario(name).with_seed(seed), policy=policy, policy_config=config,
                results=_results(scale * (1 + 0.1 * k)), run={}, env={"git": {}, "packages": {}},
            )  # fmt: skip
            write_summary(root, summary)


def _fixture(tmp_path: Path) -> Path:
    summaries = tmp_path / "summaries"
    _write(summaries, "mixed-gpu", {"round-robin": 0.1, "epp-default": 0.02, "vllm-cache_aware": 0.05,
                                    "sglang-cache_aware": 0.08, "oracle": 0.01}, earlier=True)  # fmt: skip
    _write(summaries, "family-toy", {"round-robin": 0.1, "epp-default": 0.05, "sglang-power_of_two": 0.2})
    return summaries


def _docs(root: Path) -> None:
    """A results page and a README with the glance markers, and a family section held elsewhere."""
    (root / "docs" / "benchmarks").mkdir(parents=True)
    (root / RESULTS).write_text(
        "# Benchmark results\n\n<!-- bench:headline:start -->\n<!-- bench:headline:end -->\n"
    )
    (root / README).write_text(
        "# project\n\n<!-- bench:headline:start -->\n<!-- bench:headline:end -->\n\n## More\n"
    )
    write_section(root / "docs" / "benchmarks" / "other.md", "scenario:family-toy", "### family-toy\n")


def test_glance_table_and_figure_come_from_the_summaries(tmp_path: Path) -> None:
    summaries = _fixture(tmp_path)
    virtual = tmp_path / "summaries-virtual"  # beside the real-time root, as in bench/
    _write(virtual, "mixed-gpu", {"round-robin": 0.1, "oracle": 0.03, "epp-default": 0.02})
    root = tmp_path / "repo"
    _docs(root)
    assert main(["report", "--summaries", str(summaries), "--root", str(root)]) == 0
    readme = (root / README).read_text()
    assert readme.startswith("# project\n") and readme.rstrip().endswith("## More")
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in readme.splitlines()
        if line.startswith("| [") or line.startswith("| `")
    }
    # The published rows in AWS's order (those without runs say so), then the families.
    names = list(rows)
    assert names[0] == "[`mixed-gpu`](docs/benchmarks/scenarios.md#mixed-gpu)"
    assert names[-1] == "[`family-toy`](docs/benchmarks/other.md#family-toy)"  # where its section is
    assert rows["`uniform`"][1:] == ["not run"] * 4
    what, base, ours, peer, oracle = rows[names[0]]
    assert what == "AWS: mixed GPU generations, Llama-3.1-8B" and "[" in base
    assert ours == "stale"  # ran an earlier default: no figure (issue #53)
    assert peer.startswith("vllm-cache_aware -50 % (")  # the lowest peer median
    assert oracle.startswith("-70 % (")  # virtual time's oracle vs virtual time's round-robin
    family = rows[names[-1]]
    assert family[0] == "held-out family" and family[2].startswith("-50 %") and "earlier" not in family[2]
    assert family[3].startswith("sglang-power_of_two +100 %") and family[4] == "not run"
    assert "![TTFT P95 vs round-robin](docs/img/results.png)" in readme
    # On the results page the links and the image are relative to docs/.
    results = (root / RESULTS).read_text()
    assert "](benchmarks/scenarios.md#mixed-gpu)" in results and "](img/results.png)" in results
    figure = root / FIGURE
    assert figure.read_bytes().startswith(PNG_MAGIC)
    rows = headline_rows(load_summaries(summaries, "quick"), load_summaries(virtual, "quick"))
    assert figure_digest(figure) == digest(rows)


def test_the_figure_digest_follows_the_numbers(tmp_path: Path) -> None:
    summaries = _fixture(tmp_path)
    before = digest(headline_rows(load_summaries(summaries, "quick")))
    _write(summaries, "mixed-gpu", {"epp-default": 0.03}, earlier=True)
    assert digest(headline_rows(load_summaries(summaries, "quick"))) != before


def test_sections_are_rewritten_where_they_are_and_new_ones_go_to_their_page(tmp_path: Path) -> None:
    docs = DocSet(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / RESULTS).write_text("# Benchmark results\n")
    assert docs.place("scenario:new-one") == tmp_path / SCENARIOS
    assert docs.place("scenario:family-new") == tmp_path / FAMILIES
    assert (tmp_path / FAMILIES).read_text().startswith("# Benchmarks: the held-out scenario families")
    write_section(tmp_path / FAMILIES, "scenario:moved", "### moved\n")
    assert docs.place("scenario:moved") == tmp_path / FAMILIES
    assert docs.link("scenario:moved", "moved", README) == "docs/benchmarks/families.md#moved"
    assert docs.link("scenario:absent", "absent", README) is None


def test_the_committed_pages_and_figure_are_the_generated_ones(tmp_path: Path, monkeypatch) -> None:
    """Rerunning `python -m bench report --mode quick` on the committed summaries changes no
    committed page (README included) and gives the committed figure's numbers; no network."""

    def no_network(*args, **kwargs):
        raise AssertionError("the report must not open connections")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    pages = [
        Path(README),
        Path(RESULTS),
        *sorted(p.relative_to(REPO) for p in (REPO / "docs/benchmarks").glob("*.md")),
    ]
    for page in pages:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / page, tmp_path / page)
    code = main(
        [
            "report",
            "--summaries",
            str(REPO / "bench" / "summaries"),
            "--root",
            str(tmp_path),
            "--mode",
            "quick",
        ]
    )
    assert code == 0
    stale = [str(p) for p in pages if (tmp_path / p).read_text() != (REPO / p).read_text()]
    added = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "docs/benchmarks").glob("*.md"))
    assert not stale and added == sorted(str(p) for p in pages[2:]), (
        f"run `python -m bench report --mode quick` and commit the pages: {stale or added}"
    )
    assert figure_digest(tmp_path / FIGURE) == figure_digest(REPO / FIGURE), (
        f"{FIGURE} is stale: run `python -m bench report --mode quick` and commit it"
    )


@pytest.mark.parametrize("page", [RESULTS])
def test_the_results_page_is_short(page: str) -> None:
    assert len((REPO / page).read_text().splitlines()) <= 300
