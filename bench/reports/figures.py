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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.stats import change_pct
from bench.harness.summary import REPORTING_SEEDS, load_summaries
from bench.reports.report import spread

# The pages whose prose quotes results (paths relative to the repository).
CHECKED_PAGES = (
    "docs/benchmarks.md",
    "docs/benchmarks/replicas.md",
    "docs/benchmarks/identical-fleets.md",
    "docs/benchmarks/agentic.md",
    "docs/benchmarks/slo.md",
    "docs/benchmarks/virtual-time.md",
)
SCENARIOS_DIR = "bench/scenarios"
EXEMPT_KINDS = ("historical", "inputs", "quoted", "seeds")
GOAL_WORDS = re.compile(r"(?:\bwithin|\bgoal:?|<=|>=|≤|≥)\s*$", re.I)

MINUS = "\u2212"  # typeset minus sign
_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
# A number: a sign only where a word cannot end before it (so the dash of "504-625" is not one);
# never glued to letters ("4cc75b7", "100k", "H100"); its unit glued or one space away.
_TOKEN = re.compile(
    rf"(?<![\w.,])(?P<sign>[+\-\u2212~]?)(?P<num>{_NUM})(?![\d])"
    rf"(?:\s?(?P<unit>ms|us|µs|s|%)(?![\w%])|(?P<x>x)(?![\w])(?!\s[A-Z]))?(?![\w.]\w)"
)
_LIST_SEP = re.compile(r"^\s*(?:/|to|vs|->|-|\u2013|\[|\]|,\s*and)?\s*\[?\s*$")
_HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
_CODE_SPAN = re.compile(r"`([^`]*)`")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")
_COMMENT = re.compile(r"<!--(.*?)-->", re.S)
# `bench report`'s blocks, and those other generators write (`<!-- pd-sim:start -->`).
_MARKER = re.compile(r"<!-- (?:bench:)?([\w.:-]+?):(start|end) -->")


@dataclass(frozen=True)
class Figure:
    """One quoted number in a canonical unit: `ms` (times), `%` or `x`."""

    value: float
    unit: str
    signed: bool  # written with + or -: the sign is part of the claim
    half_step: float  # half the last written digit's step, in the canonical unit: its rounding
    text: str
    offset: int  # where in the line or block text it starts
    group: int = -1  # where its list ("2.7-4.4 / 2.1-2.8 s") starts

    def matches(self, other: Figure) -> bool:
        if self.unit != other.unit:
            return False
        if other.half_step > max(self.half_step, 0.05 * abs(other.value)) + 1e-9:
            return False  # too coarse to stand for the quote ("0.5 s", "1 s"): no source of it
        mine = self.value if self.signed else abs(self.value)
        theirs = other.value if self.signed else abs(other.value)
        return abs(mine - theirs) <= self.half_step + other.half_step + 1e-9


def _canonical(number: str, sign: str, unit: str) -> tuple[float, float]:
    plain = number.replace(",", "")
    decimals = len(plain.split(".")[1]) if "." in plain else 0
    value = float(plain) * (-1 if sign in ("-", MINUS) else 1)
    half = 0.5 * 10**-decimals
    scale = {"s": 1000.0, "us": 0.001, "µs": 0.001}.get(unit, 1.0)
    return value * scale, half * scale


def figures_in(text: str, column_unit: str | None = None) -> list[Figure]:
    """The figures of a text: numbers with a unit, a unitless number taking the unit of the list it
    belongs to ("-8.0 / -0.3 %", "518 ms [504-625]", "2.7-4.4 s"), else `column_unit` if given."""
    tokens = list(_TOKEN.finditer(text))
    units: list[str | None] = [m["unit"] or ("x" if m["x"] else None) for m in tokens]
    groups: list[list[int]] = []
    for i, m in enumerate(tokens):
        if groups and _LIST_SEP.match(text[tokens[i - 1].end() : m.start()]):
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for group in groups:
        for pos, i in enumerate(group):
            unit = units[i]
            if unit is None:  # the nearest unit in its list, to the right first
                right = [units[j] for j in group[pos + 1 :] if units[j]]
                left = [units[j] for j in reversed(group[:pos]) if units[j]]
                unit = (right or left or [column_unit])[0]
            if unit is None:
                continue
            m = tokens[i]
            value, half = _canonical(m["num"], m["sign"], unit)
            canon = "ms" if unit in ("s", "ms", "us", "µs") else unit
            signed = m["sign"] in ("+", "-", MINUS)
            out.append(
                Figure(value, canon, signed, half, m.group(0).strip(), m.start(), tokens[group[0]].start())
            )
    return out


def column_units(header: str) -> list[str | None]:
    """The unit each column's header names ("TTFT P95 ms", "hit %", "wall s"), None if none."""
    units: list[str | None] = []
    for cell in _cells(header):
        words = re.findall(r"ms|us|%|(?<!/)\bs\b", cell)
        units.append(words[-1] if words else None)
    return units


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _is_table(line: str) -> bool:
    return line.lstrip().startswith("|")


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\|?[\s:|-]+\|?", line.strip())) and "-" in line


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
    if _is_table(text):
        found |= {c.strip("`* ") for c in _cells(text) if c.strip("`* ") in scenarios}
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
        if not _is_table(line):
            units = []
            if named and re.match(r"^(#+\s|\*\*)", line):
                context = ({key.partition(":")[2]} & scenarios) | named
            rows.append(Row(rel, number, line, context | named, figures_in(line), key))
            continue
        if not units:
            units = column_units(line)
            continue
        if _is_rule(line):
            continue
        cells = _cells(line)
        if not named and cells and not cells[0]:
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
        for body in _COMMENT.findall(line):
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
        if _is_table(line):
            if header is None:  # the header: its units name the unitless cells below
                header = column_units(line)
                intro = "\n".join(current.lines) if current is not None else intro
            elif not _is_rule(line):
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


@dataclass(frozen=True)
class Check:
    root: str
    scenario: str
    policy: str
    versus: str | None
    metric: str


def parse_check(body: str) -> Check | None:
    words = body.split()
    if words[:1] != ["check:"]:
        return None
    rest = words[1:]
    if len(rest) == 6 and rest[3] == "vs":
        return Check(rest[0], rest[1], rest[2], rest[4], rest[5])
    if len(rest) == 4:
        return Check(rest[0], rest[1], rest[2], None, rest[3])
    raise ValueError(f"a check reads `check: <root> <scenario> <policy> [vs <policy>] <metric>`: {body!r}")


class Summaries:
    """Medians over the reporting seeds, by root, scenario, policy and metric (loaded once)."""

    def __init__(self, root: Path, mode: str = "quick") -> None:
        self.root = root
        self.mode = mode
        self._loaded: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}

    def median(self, where: str, scenario: str, policy: str, metric: str) -> float | None:
        if where not in self._loaded:
            self._loaded[where] = load_summaries(self.root / where, self.mode, REPORTING_SEEDS)
        runs = self._loaded[where].get(scenario, {}).get(policy, [])
        found = spread(runs, metric if "." in metric else f"steady.{metric}")
        return None if found is None else found.median

    def value(self, check: Check, unit: str) -> float | None:
        """The checked figure in the prose figure's canonical unit."""
        mine = self.median(check.root, check.scenario, check.policy, check.metric)
        if check.versus is None:
            if mine is None:
                return None
            return mine * 1000 if unit == "ms" else mine * 100 if unit == "%" else mine
        other = self.median(check.root, check.scenario, check.versus, check.metric)
        if unit == "x":
            return None if mine is None or not other else mine / other
        if unit == "ms":  # a difference: "+68 ms"
            return None if mine is None or other is None else (mine - other) * 1000
        return change_pct(mine, other)


def check_page(rel: str, root: Path, summaries: Summaries | None = None) -> list[Problem]:
    """The page's prose figures that are neither in its (or its linked pages') generated tables,
    nor checked, nor goals, nor exempt."""
    root = Path(root)
    page = root / rel
    scenarios = known_scenarios(root)
    summaries = summaries or Summaries(root)
    cache: dict[Path, list[Row]] = {}

    def rows_of(path: Path) -> list[Row]:
        if path not in cache:
            cache[path] = generated_rows(path, path.relative_to(root.resolve()).as_posix(), scenarios)
        return cache[path]

    reader = _Reader(rel, page.resolve(), root.resolve(), scenarios, rows_of, summaries)
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
        return problems
    # Checks first: each applies to the last figure before it.
    checked: dict[int, Check | str] = {}
    plain = text
    for m in _COMMENT.finditer(text):
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
            problem = _verify(note, figure, summaries)
            if problem:
                problems.append(Problem(rel, line, figure.text, problem))
            continue
        if isinstance(note, str):
            problem = _exemption_problem(note)
            if problem:
                problems.append(Problem(rel, line, figure.text, problem))
            continue
        if GOAL_WORDS.search(blanked[: figure.offset]):
            continue
        if block.strict:
            problems.append(
                Problem(rel, line, figure.text, "is in a checked section: give it a check or an exemption")
            )
            continue
        if any(figure.matches(f) for r in scope for f in r.figures):
            continue
        problems.append(Problem(rel, line, figure.text, _not_found(figure, scope, pages, named, root)))
    return problems


def _exemption_problem(note: str) -> str | None:
    kind, _, why = note.partition(" ")
    if kind not in EXEMPT_KINDS or not why.strip():
        return f"an exemption reads `<kind> <why>`, kind one of {', '.join(EXEMPT_KINDS)}"
    if kind == "historical" and not (
        _HEX.search(why) or any(w in why for w in ("bench/", "bench.", "-m bench"))
    ):
        return "a historical figure names its commit, its bench/ folder or the bench command that gave it"
    return None


def _blank_comments(text: str) -> str:
    return _blank(text, _COMMENT)


def _verify(check: Check, figure: Figure, summaries: Summaries) -> str | None:
    value = summaries.value(check, figure.unit)
    if value is None:
        return f"is checked against {check} but the summaries have no such figure"
    if abs((value if figure.signed else abs(value)) - figure.value) <= figure.half_step + 1e-9:
        return None
    versus = f" vs {check.versus}" if check.versus else ""
    what = f"{check.root} {check.scenario} {check.policy}{versus} {check.metric}"
    return f"disagrees with the summaries: {what} gives {value:.4g} {figure.unit}"


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", default=list(CHECKED_PAGES))
    parser.add_argument("--root", default=".")
    args = parser.parse_args(argv)
    root = Path(args.root)
    summaries = Summaries(root)
    problems = [p for rel in args.pages for p in check_page(rel, root, summaries)]
    for problem in problems:
        print(problem)
    print(f"{len(problems)} figure(s) not matched", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
