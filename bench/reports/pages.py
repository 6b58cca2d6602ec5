"""Where `python -m bench report` writes: the results page, the pages under docs/benchmarks/, the README.

The results page (docs/benchmarks.md) is short: the glance table and figure, the targets, the
published rows and what is missed. Every other generated section (each scenario's tables, the
A10G sensitivity table) lives in one of the pages under docs/benchmarks/, next to its
hand-written findings: a section is rewritten in whichever page holds its markers, and a new
one is appended to `SCENARIOS`. Paths are relative to a root (the repository; a copy of it in
the tests).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.equal_cpu import SECTION as EQUAL_CPU_SECTION
from bench.reports.equal_cpu import section_for as equal_cpu_section
from bench.reports.headline import SECTION as HEADLINE
from bench.reports.headline import headline_rows, plot_headline, render_headline
from bench.reports.published import SECTION as PUBLISHED_SECTION
from bench.reports.published import published_section
from bench.reports.report import _markers, build_report, write_section
from bench.reports.scorecard import FAMILY_PREFIX, scorecard_for
from bench.reports.sensitivity import SECTION as SENSITIVITY_SECTION
from bench.reports.sensitivity import section_for as sensitivity_section

RESULTS = "docs/benchmarks.md"
PAGES_DIR = "docs/benchmarks"
SCENARIOS = "docs/benchmarks/scenarios.md"  # where a section without a page yet is added
FAMILIES = "docs/benchmarks/families.md"  # ... or, for a held-out family (`family-*`), here
README = "README.md"
VIRTUAL_ROOT = "summaries-virtual"  # the headline's oracle: the virtual-time root beside `summaries`
FIGURE = "docs/img/results.png"
IMAGES = "docs/img"
TITLES = {
    SCENARIOS: "# Benchmarks: every scenario's tables",
    FAMILIES: "# Benchmarks: the held-out scenario families",
}


class DocSet:
    """The results page and the pages under docs/benchmarks/ of one root."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def pages(self) -> list[Path]:
        pages_dir = self.root / PAGES_DIR
        found = sorted(pages_dir.glob("*.md")) if pages_dir.is_dir() else []
        return [self.root / RESULTS, *found]

    def holder(self, key: str) -> Path | None:
        """The page holding the markers of `key`, if any."""
        start, _ = _markers(key)
        for page in self.pages():
            if page.exists() and start in page.read_text():
                return page
        return None

    def place(self, key: str) -> Path:
        """The page for a section: the one holding its markers, else `SCENARIOS` (created with
        its title when missing)."""
        page = self.holder(key)
        if page is not None:
            return page
        default = FAMILIES if key.startswith(f"scenario:{FAMILY_PREFIX}") else SCENARIOS
        page = self.root / default
        if not page.exists():
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(f"{TITLES[default]}\n\n")
        return page

    def link(self, key: str, anchor: str, source: str) -> str | None:
        """A relative link from the file `source` (relative to the root) to `anchor` in the page
        holding `key`; None when no page holds it."""
        page = self.holder(key)
        if page is None:
            return None
        rel = Path(os.path.relpath(page, (self.root / source).parent)).as_posix()
        return f"{rel}#{slug(anchor)}"


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _linker(docs: DocSet, source: str) -> Callable[[str], str | None]:
    """Scenario name -> its section's link from `source`."""
    return lambda scenario: docs.link(f"scenario:{scenario}", scenario, source)


def render_report(
    root: str | Path,
    summaries: str | Path,
    mode: str = "quick",
    baseline: str = "round-robin",
    results: str | Path | None = None,
) -> list[str]:
    """Every generated part from the summaries: scenario sections, the sensitivity table, the
    targets, the published rows, then the glance table (results page and README) and its
    figure, whose links need the sections in place. Returns the scenarios rendered."""
    root = Path(root)
    docs = DocSet(root)
    names = build_report(summaries, docs.place, root / IMAGES, baseline, mode, results)
    sensitivity = sensitivity_section(str(summaries), mode)
    if sensitivity is not None:
        write_section(docs.place(SENSITIVITY_SECTION), SENSITIVITY_SECTION, sensitivity)
    equal_cpu = equal_cpu_section(str(summaries), mode)
    if equal_cpu is not None:
        write_section(docs.place(EQUAL_CPU_SECTION), EQUAL_CPU_SECTION, equal_cpu)
    results_page = root / RESULTS
    for key, text in (
        ("targets", scorecard_for(summaries, mode)),
        (PUBLISHED_SECTION, published_section(summaries, mode)),
    ):
        if text is not None:
            write_section(results_page, key, text)
    runs = load_summaries(summaries, mode, REPORTING_SEEDS)
    if runs:
        virtual = load_summaries(Path(summaries).with_name(VIRTUAL_ROOT), mode, REPORTING_SEEDS)
        rows = headline_rows(runs, virtual)
        plot_headline(rows, root / FIGURE)
        for source in (RESULTS, README):
            page = root / source
            if source == README and not page.exists():
                continue  # a copy of the docs without the README (tests)
            image = Path(os.path.relpath(root / FIGURE, page.parent)).as_posix()
            write_section(page, HEADLINE, render_headline(rows, _linker(docs, source), image))
    return names
