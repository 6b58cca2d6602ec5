"""The prose of every page quotes only figures the generated tables or the committed summaries give,
or says why a figure is exempt (issues #45, #53): bench/reports/figures.py, on the committed pages
and on copies with one figure changed."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from bench.reports.figures import (
    CHECKED_PAGES,
    COUNTS_KEY,
    COUNTS_PAGE,
    Summaries,
    check_page,
    figure_counts,
    figures_in,
    render_counts,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def summaries() -> Summaries:
    return Summaries(REPO)


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_every_figure_the_prose_quotes_is_in_the_tables_or_checked(page: str, summaries: Summaries) -> None:
    problems = check_page(page, REPO, summaries)
    assert not problems, "prose figures that disagree with the tables:\n" + "\n".join(map(str, problems))


def _copy(tmp_path: Path) -> Path:
    """The docs copied (to change), bench/ and its summaries linked (read only)."""
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "bench").symlink_to(REPO / "bench")
    return tmp_path


def _change(root: Path, page: str, old: str, new: str) -> int:
    path = root / page
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {page}"
    path.write_text(text.replace(old, new))
    return text[: text.index(old)].count("\n") + 1


def test_a_changed_figure_fails_naming_page_line_figure_and_the_table_value(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    page = "docs/benchmarks/replicas.md"
    line = _change(root, page, "`lora` -8.5 / -41.3 %", "`lora` -8.5 / -31.3 %")
    problems = check_page(page, root)
    assert [(p.page, p.line, p.figure) for p in problems] == [(page, line, "-31.3 %")]
    message = str(problems[0])
    print(message)  # the report's example
    assert message.startswith(f"{page}:{line}: '-31.3 %' is in no generated table of {page}")
    assert "kv-cache-wins, lora, shared-prefix; nearest: '-41.3 %'" in message  # the scenarios it names
    assert "| lora | 2 |" in message  # and the table row holding the value


def test_a_changed_checked_figure_fails_with_the_summaries_value(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    page = "docs/benchmarks.md"
    line = _change(
        root, page, "-53 %<!-- check: bench/summaries bursty", "-45 %<!-- check: bench/summaries bursty"
    )
    problems = check_page(page, root)
    assert [(p.line, p.figure) for p in problems] == [(line, "-45 %")]
    print(problems[0])  # the report's example
    assert (
        "disagrees with the summaries: bench/summaries bursty epp-default vs round-robin ttft_p95 gives -53.38 %"
        in str(problems[0])
    )


def test_an_exemption_says_what_it_is_and_why(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    page = "docs/benchmarks.md"
    _change(root, page, "<!-- figures: quoted DistServe", "<!-- figures: quoted-ish DistServe")
    _change(root, page, "figure: inputs bench/scenarios/bursty.yaml's", "figure: historical bursty.yaml's")
    messages = [str(p) for p in check_page(page, root)]
    assert len(messages) == 2
    assert any("historical figure names its commit" in m for m in messages)
    assert any("an exemption reads `<kind> <why>`" in m for m in messages)


def test_figures_are_read_with_their_units_lists_and_ranges() -> None:
    def read(text: str, column: str | None = None) -> list[tuple[float, str, bool]]:
        return [(round(f.value, 3), f.unit, f.signed) for f in figures_in(text, column)]

    assert read("P50 / P95: -8.0 / -0.3 %") == [(-8.0, "%", True), (-0.3, "%", True)]
    assert read("518 ms [504-625], 1.33 s") == [(518, "ms", False), (504, "ms", False), (625, "ms", False),
                                                (1330, "ms", False)]  # fmt: skip
    assert read("+43 to +58 %; 0.43x the oracle; 2.7-4.4 s") == [
        (43, "%", True), (58, "%", True), (0.43, "x", False), (2700, "ms", False), (4400, "ms", False)
    ]  # fmt: skip
    # Not figures: commits, model sizes, counts, fleet shapes, dates.
    assert read("at 4cc75b7 on Qwen3-235B, 100k-token prompts, 2x H100, 48 of 63 rows, 2026-12-06") == []
    assert read("8,270 [7,705-9,007]", "ms") == [
        (8270, "ms", False),
        (7705, "ms", False),
        (9007, "ms", False),
    ]
    checked = figures_in("-55 %")[0]
    assert checked.matches(figures_in("-54.5 %")[0]) and not checked.matches(figures_in("-30 %")[0])
    assert figures_in("518 ms")[0].matches(figures_in("0.518 s")[0])


def test_every_page_under_docs_is_checked() -> None:
    assert {"README.md", "docs/benchmarks/costs.md", "docs/reliability.md", "docs/scheduling.md"} <= set(
        CHECKED_PAGES
    )
    assert len(CHECKED_PAGES) == 1 + len(list((REPO / "docs").glob("**/*.md")))


def test_the_counts_of_every_pages_figures_are_the_generated_ones() -> None:
    """docs/benchmarks/method.md's table: each page's figures by how they pass, exempt ones by kind."""
    text = (REPO / COUNTS_PAGE).read_text()
    block = re.search(
        rf"<!-- bench:{COUNTS_KEY}:start -->\n(.*?)\n<!-- bench:{COUNTS_KEY}:end -->", text, re.S
    )
    assert block is not None
    counts = figure_counts(REPO)
    assert all(c["unmatched"] == 0 for c in counts.values())
    assert block[1] == render_counts(counts), "run `python -m bench.reports.figures --counts` and commit"


def test_quoted_is_for_other_peoples_figures(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    page = "docs/benchmarks/pd.md"
    text = (root / page).read_text()
    old = "<!-- figures: quoted the SGLang team's blog"
    assert old in text
    (root / page).write_text(
        text.replace(old, "<!-- figures: quoted `python -m bench.probes.pd_sim` and the SGLang team's blog")
    )
    messages = [str(p) for p in check_page(page, root)]
    assert messages and all("quoted is for others' published figures" in m for m in messages)
