"""Every figure the hand-written prose of a results page quotes, checked against the generated tables.

The tables between `<!-- bench:<key>:start -->` and `<!-- bench:<key>:end -->` are computed from
the committed summaries (tests/bench/test_bench_pages.py keeps them so); the prose around them is
written by hand and drifts when the tables are regenerated. A figure here is a number with a
unit, `ms`, `s`, `us`, `%` or `x`, as in "-55 %", "518 ms [504-625]", "+1.9 / +2.3 %",
"0.43x". Each one in the prose of a checked page (a paragraph, a list item, a hand-written table
row) must be one of:

- **in a generated table**: the same value, within the prose figure's rounding, in a generated
  block of the same page or of a page the paragraph links to, on a row (or under a heading) of
  a scenario the paragraph names in backticks or links to (any row when it names none);
- **checked**: followed by `<!-- check: <summaries root> <scenario> <policy> [vs <policy>]
  <metric> -->`, which recomputes it from the summaries (median over the reporting seeds; with
  `vs`: the change in % of the medians, their ratio for a figure in `x`, their difference for
  one in ms);
- **a goal**, not a result: right after "within", "goal", "<=" or ">=";
- in a section opened by `<!-- figures: checked -->` (the results page's findings), only checked
  or exempt: being somewhere in the tables is not enough there;
- **exempt, and said so**: in a section opened by `<!-- figures: <kind> <why> -->`, up to the
  next heading or `<!-- figures: end -->`, where kind is `historical` (a run other than the
  committed summaries': the why names its commit or its `bench/` folder), `inputs` (configured
  or calibration values, the fleet's and the workload's shape), `quoted` (others' published
  figures: the why names the source) or `seeds` (single seeds' values of the summaries named,
  where the tables give medians); one figure alone: `<!-- figure: <kind> <why> -->` right
  after it.

Figures in code spans and code blocks are commands, not quotes. `python -m bench.reports.figures`
lists the figures that fail.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness.summary import REPO_ROOT
from bench.reports.figure_checks import Check, Summaries, parse_check, verify
from bench.reports.figure_text import Figure, cells, column_units, figures_in, is_rule, is_table
from bench.reports.report import write_section

__all__ = ["CHECKED_PAGES", "Check", "Figure", "Summaries", "check_page", "figures_in", "parse_check"]


# Every page that states results: the README and every page under docs/ (paths relative to the
# repository); a page's configured values and others' figures are exempt by kind, and counted.
def checked_pages(root: Path) -> tuple[str, ...]:
    pages = [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]
    return tuple(p.relative_to(root).as_posix() for p in pages if p.is_file())


CHECKED_PAGES = checked_pages(REPO_ROOT)
SCENARIOS_DIR = "bench/scenarios"
EXEMPT_KINDS = ("historical", "inputs", "quoted", "seeds")
GOAL_WORDS = re.compile(r"(?:\bwithin|\bgoal:?|<=|>=|≤|≥)\s*$", re.I)

_HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
_CODE_SPAN = re.compile(r"`([^`]*)`")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")
_COMMENT = re.compile(r"<!--(.*?)-->", re.S)
# `bench report`'s blocks, and those other generators write (`<!-- pd-sim:start -->`).
_MARKER = re.compile(r"<!-- (?:bench:)?([\w.:-]+?):(start|end) -->")


@dataclass
class Row:
    """One line of a generated block, its figures and the scenarios it belongs to."""

    page: str
    line: int
    text: str
    scenarios: set[str]
    figures: list[Figure]
    key: str = ""  # the generated block's key


@dataclass
class Block:
    """A paragraph, list item or hand-written table row of prose."""

    line: int
    lines: list[str] = field(default_factory=list)
    exempt: str | None = None
    strict: bool = False  # in a `<!-- figures: checked -->` section: every figure checked
    units: list[str | None] | None = None  # a table row: its columns' units (from the header)
    context: str = ""  # a table row: the paragraph introducing the table (its links, scenarios)


@dataclass(frozen=True)
class Problem:
    page: str
    line: int
    figure: str
    message: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.figure!r} {self.message}"


def known_scenarios(root: Path) -> set[str]:
    return {p.stem for p in (root / SCENARIOS_DIR).glob("*.yaml")}


def _named(text: str, scenarios: set[str]) -> set[str]:
    """Scenarios a text names: in backticks, as a link's anchor or text, or as a whole table cell
    or a bold/heading word."""
    found = {s for span in _CODE_SPAN.findall(text) for s in [span.strip()] if s in scenarios}
    for label, target in _LINK.findall(text):
        anchor = target.partition("#")[2]
        found |= {s for s in (anchor, label.strip("` ")) if s in scenarios}
    if is_table(text):
        found |= {c.strip("`* ") for c in cells(text) if c.strip("`* ") in scenarios}
    heading = re.match(r"^(?:#+\s+|\*\*)`?([\w.-]+)`?(?:\*\*)?", text)
    if heading and heading[1] in scenarios:
        found.add(heading[1])
    return found


def generated_rows(page: Path, rel: str, scenarios: set[str]) -> list[Row]:
    """Every line inside the page's generated blocks, with its figures (a table cell's numbers
    take its column's unit) and scenarios (its own cells, the block's key, the last heading)."""
    rows: list[Row] = []
    key: str | None = None
    context: set[str] = set()
    units: list[str | None] = []
    previous: set[str] = set()
    for number, line in enumerate(page.read_text().splitlines(), 1):
        marker = _MARKER.search(line)
        if marker:
            key = marker[1] if marker[2] == "start" else None
            context = {key.partition(":")[2]} & scenarios if key else set()
            units = []
            continue
        if key is None:
            continue
        named = _named(line, scenarios)
        if line.startswith("Setup:"):
            continue  # a scenario section's inputs (fleet, rate, duration, SLO), not results
        if not is_table(line):
            units = []
            if named and re.match(r"^(#+\s|\*\*)", line):
                context = ({key.partition(":")[2]} & scenarios) | named
            rows.append(Row(rel, number, line, context | named, figures_in(line), key))
            continue
        if not units:
            units = column_units(line)
            continue
        if is_rule(line):
            continue
        row_cells = cells(line)
        if not named and row_cells and not row_cells[0]:
            named = previous  # a continuation row under the scenario of the row above
        previous = named
        rows.append(Row(rel, number, line, context | named, row_figures(line, units), key))
    return rows


def prose_blocks(text: str) -> list[Block]:
    """The page's hand-written blocks (generated blocks and code left out), each with the
    exemption in force where it starts."""
    blocks: list[Block] = []
    exempt: str | None = None
    strict = False
    generated = fenced = False
    current: Block | None = None
    header: list[str | None] | None = None  # the units of the table being read
    intro = ""  # the last paragraph before it
    for number, line in enumerate(text.splitlines(), 1):
        marker = _MARKER.search(line)
        if marker:
            generated = marker[2] == "start"
            current, header = None, None
            continue
        if line.lstrip().startswith("```"):
            fenced = not fenced
            current = None
            continue
        if generated or fenced:
            continue
        for body in (m[1] for m in _live_comments(line)):
            words = body.split()
            if words[:1] == ["figures:"]:
                strict = words[1:2] == ["checked"]
                exempt = None if words[1:2] in (["end"], ["checked"]) else " ".join(words[1:])
        if line.startswith("#"):
            exempt, strict, current, header, intro = None, False, None, None, ""
            continue
        stripped = line.strip()
        indented_code = line.startswith("    ") and (current is None or not current.lines)
        if not stripped or indented_code:
            if current is not None:
                intro = "\n".join(current.lines)
            current, header = None, None
            continue
        if is_table(line):
            if header is None:  # the header: its units name the unitless cells below
                header = column_units(line)
                intro = "\n".join(current.lines) if current is not None else intro
            elif not is_rule(line):
                blocks.append(Block(number, [line], exempt, strict, header, intro))
            current = None
            continue
        header = None
        starts_item = bool(re.match(r"^\s*(?:[-*]|\d+\.)\s", line))
        if current is None or starts_item:
            current = Block(number, exempt=exempt, strict=strict)
            blocks.append(current)
        current.lines.append(line)
        intro = ""
    return blocks


def row_figures(text: str, units: list[str | None] | None) -> list[Figure]:
    """A text's figures; a table row's cell by cell, a unitless number taking its column's unit."""
    if units is None:
        return figures_in(text)
    out: list[Figure] = []
    start = 0
    stripped = text.rstrip()
    cells = stripped.split("|")
    for index, cell in enumerate(cells):
        column = index - 1 if stripped.lstrip().startswith("|") else index
        unit = units[column] if 0 <= column < len(units) else None
        for f in figures_in(cell, unit):
            out.append(dataclasses.replace(f, offset=f.offset + start, group=f.group + start))
        start += len(cell) + 1
    return out


def _linked_pages(text: str, page: Path, root: Path) -> list[Path]:
    out = []
    for _, target in _LINK.findall(text):
        path = target.partition("#")[0]
        if path.endswith(".md"):
            resolved = (page.parent / path).resolve()
            if resolved.is_file() and root.resolve() in resolved.parents:
                out.append(resolved)
    return out


def check_page(
    rel: str, root: Path, summaries: Summaries | None = None, exempt: Counter[str] | None = None
) -> list[Problem]:
    """The page's prose figures that are neither in its (or its linked pages') generated tables,
    nor checked, nor goals, nor exempt; `exempt` counts the exempt ones by kind."""
    root = Path(root)
    page = root / rel
    scenarios = known_scenarios(root)
    summaries = summaries or Summaries(root)
    cache: dict[Path, list[Row]] = {}

    def rows_of(path: Path) -> list[Row]:
        if path not in cache:
            cache[path] = generated_rows(path, path.relative_to(root.resolve()).as_posix(), scenarios)
        return cache[path]

    reader = _Reader(rel, page.resolve(), root.resolve(), scenarios, rows_of, summaries, exempt)
    return [problem for block in prose_blocks(page.read_text()) for problem in reader.check(block)]


@dataclass
class _Reader:
    """What checking one page's blocks needs."""

    rel: str
    page: Path
    root: Path
    scenarios: set[str]
    rows_of: Callable[[Path], list[Row]]
    summaries: Summaries
    exempt: Counter[str] | None = None  # figures by how they pass: table, checked, goal, or exempt by kind

    def count(self, note: str, n: int = 1) -> None:
        if self.exempt is not None:
            self.exempt[note.partition(" ")[0]] += n

    def check(self, block: Block) -> list[Problem]:
        return _check_block(block, self)


def _check_block(block: Block, reader: _Reader) -> list[Problem]:
    rel, page, root, scenarios = reader.rel, reader.page, reader.root, reader.scenarios
    rows_of, summaries = reader.rows_of, reader.summaries
    text = "\n".join(block.lines)
    problems: list[Problem] = []
    if block.exempt is not None:
        problem = _exemption_problem(block.exempt)
        if problem:
            problems.append(Problem(rel, block.line, block.exempt, problem))
        blank = _blank_code(_blank_links(_blank_comments(text)))
        reader.count(block.exempt, len(row_figures(blank, block.units)))
        return problems
    # Checks first: each applies to the last figure before it.
    checked: dict[int, Check | str] = {}
    plain = text
    for m in _live_comments(text):
        words = m[1].split()
        try:
            note: Check | str | None = parse_check(m[1])
        except ValueError as exc:
            problems.append(Problem(rel, block.line, m[0], str(exc)))
            continue
        if words[:1] == ["figure:"]:
            note = " ".join(words[1:])
        if note is not None:
            before = row_figures(_blank_code(_blank_links(_blank_comments(text[: m.start()]))), block.units)
            if not before:
                problems.append(Problem(rel, block.line, m[0], "follows no figure"))
            elif isinstance(note, Check):
                checked[before[-1].offset] = note
            else:  # an exemption covers the figure's whole list ("2-3 ms")
                checked.update({f.offset: note for f in before if f.group == before[-1].group})
        plain = plain[: m.start()] + " " * (m.end() - m.start()) + plain[m.end() :]
    about = f"{block.context}\n{text}"  # a table row is read with the paragraph introducing it
    named = _named(text, scenarios) | _named(block.context, scenarios)
    pages = [page, *dict.fromkeys(p for p in _linked_pages(about, page, root) if p != page)]
    scope = [r for p in pages for r in rows_of(p)]
    anchors = {target.partition("#")[2] for _, target in _LINK.findall(about)} - {""}
    if named:  # its scenarios' rows, and the blocks it links to by name (`#a10g-sensitivity`)
        scope = [r for r in scope if r.scenarios & named or r.key in anchors]
    blanked = _blank_code(_blank_links(plain))
    for figure in row_figures(blanked, block.units):
        line = block.line + text[: figure.offset].count("\n")
        note = checked.get(figure.offset)
        if isinstance(note, Check):
            problem = verify(note, figure, summaries)
            if problem:
                problems.append(Problem(rel, line, figure.text, problem))
            reader.count("checked")
            continue
        if isinstance(note, str):
            problem = _exemption_problem(note)
            if problem:
                problems.append(Problem(rel, line, figure.text, problem))
            reader.count(note)
            continue
        if GOAL_WORDS.search(blanked[: figure.offset]):
            reader.count("goal")
            continue
        if block.strict:
            problems.append(
                Problem(rel, line, figure.text, "is in a checked section: give it a check or an exemption")
            )
            continue
        if any(figure.matches(f) for r in scope for f in r.figures):
            reader.count("table")
            continue
        problems.append(Problem(rel, line, figure.text, _not_found(figure, scope, pages, named, root)))
    return problems


def _exemption_problem(note: str) -> str | None:
    kind, _, why = note.partition(" ")
    if kind not in EXEMPT_KINDS or not why.strip():
        return f"an exemption reads `<kind> <why>`, kind one of {', '.join(EXEMPT_KINDS)}"
    ours = any(w in why for w in ("bench/", "bench.", "-m bench"))
    if kind == "historical" and not (_HEX.search(why) or ours):
        return "a historical figure names its commit, its bench/ folder or the bench command that gave it"
    if kind == "quoted" and ours:
        return "quoted is for others' published figures: ours, from a bench run, are historical"
    return None


def _live_comments(text: str) -> list[re.Match[str]]:
    """The text's comments but those inside a code span (a page showing the syntax)."""
    spans = [m.span() for m in _CODE_SPAN.finditer(text)]
    return [m for m in _COMMENT.finditer(text) if not any(a < m.start() < b for a, b in spans)]


def _blank_comments(text: str) -> str:
    return _blank(text, _COMMENT)


def _not_found(
    figure: Figure, scope: Sequence[Row], pages: Iterable[Path], named: set[str], root: Path
) -> str:
    where = ", ".join(p.relative_to(root).as_posix() for p in pages)
    about = f" for {', '.join(sorted(named))}" if named else ""
    same = [(abs(f.value - figure.value), f, r) for r in scope for f in r.figures if f.unit == figure.unit]
    if not same:
        return f"is in no generated table of {where}{about}"
    _, nearest, row = min(same, key=lambda t: t[0])
    return (
        f"is in no generated table of {where}{about}; nearest: {nearest.text!r} "
        f"at {row.page}:{row.line}: {row.text.strip()[:160]}"
    )


def _blank(text: str, pattern: re.Pattern[str], keep: int | None = None) -> str:
    def repl(m: re.Match[str]) -> str:
        if keep is None:
            return " " * len(m.group(0))
        start, end = m.span(keep)
        return " " * (start - m.start()) + m.group(keep) + " " * (m.end() - end)

    return pattern.sub(repl, text)


def _blank_code(text: str) -> str:
    return _blank(text, _CODE_SPAN)


def _blank_links(text: str) -> str:
    return _blank(text, _LINK, keep=1)


COUNTED = ("table", "checked", "goal", *EXEMPT_KINDS)
COUNTS_PAGE = "docs/benchmarks/method.md"
COUNTS_KEY = "figure-counts"
WHY = {
    "historical": "a run other than the committed summaries', named by commit, bench/ folder or command",
    "inputs": "configured or calibration values: the fleet's, the workload's, a setting's default",
    "quoted": "other people's published figures, the source named",
    "seeds": "single seeds' values of the summaries named, where the tables give medians",
}


def figure_counts(root: Path, pages: Sequence[str] | None = None) -> dict[str, Counter[str]]:
    """Per page: its prose figures by how they pass the check (and the problems as `unmatched`)."""
    summaries = Summaries(root)
    out: dict[str, Counter[str]] = {}
    for rel in pages or checked_pages(root):
        counts: Counter[str] = Counter()
        counts["unmatched"] = len(check_page(rel, root, summaries, counts))
        out[rel] = counts
    return out


def render_counts(counts: dict[str, Counter[str]]) -> str:
    """The table of every checked page's figures by how they pass, and what each exemption means."""
    head = " | ".join(COUNTED)
    lines = [f"| page | {head} | unmatched |", "|---|" + "---|" * (len(COUNTED) + 1)]
    for rel, c in counts.items():
        lines.append(f"| {rel} | " + " | ".join(str(c[k]) for k in COUNTED) + f" | {c['unmatched']} |")
    lines += ["", *(f"- {kind}: {why}" for kind, why in WHY.items())]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", default=list(CHECKED_PAGES))
    parser.add_argument("--root", default=".")
    parser.add_argument("--exempt", action="store_true", help="also count each page's exempt figures by kind")
    parser.add_argument("--counts", action="store_true", help=f"write every page's counts into {COUNTS_PAGE}")
    args = parser.parse_args(argv)
    if args.counts:
        write_section(
            Path(args.root) / COUNTS_PAGE, COUNTS_KEY, render_counts(figure_counts(Path(args.root)))
        )
        return 0
    root = Path(args.root)
    summaries = Summaries(root)
    problems: list[Problem] = []
    for rel in args.pages:
        exempt: Counter[str] = Counter()
        problems += check_page(rel, root, summaries, exempt)
        if args.exempt and exempt:
            print(f"{rel}: exempt " + ", ".join(f"{kind} {n}" for kind, n in sorted(exempt.items())))
    for problem in problems:
        print(problem)
    print(f"{len(problems)} figure(s) not matched", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
