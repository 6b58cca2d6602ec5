"""Reading figures out of text: a number with a unit (`ms`, `s`, `us`, `%`, `x`) in a canonical
unit with its rounding, lists and ranges sharing one unit, and a table's column units
(bench/reports/figures.py checks them against the generated tables)."""

from __future__ import annotations

import re
from dataclasses import dataclass

MINUS = "\u2212"  # typeset minus sign
_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
# A number: a sign only where a word cannot end before it (so the dash of "504-625" is not one);
# never glued to letters ("4cc75b7", "100k", "H100"); its unit glued or one space away.
_TOKEN = re.compile(
    rf"(?<![\w.,])(?P<sign>[+\-\u2212~]?)(?P<num>{_NUM})(?![\d])"
    rf"(?:\s?(?P<unit>ms|us|µs|s|%)(?![\w%])|(?P<x>x)(?![\w])(?!\s[A-Z]))?(?![\w.]\w)"
)
_LIST_SEP = re.compile(r"^\s*(?:/|to|vs|->|-|\u2013|\[|\]|,\s*and)?\s*\[?\s*$")


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
    for cell in cells(header):
        words = re.findall(r"ms|us|%|(?<!/)\bs\b", cell)
        units.append(words[-1] if words else None)
    return units


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def is_table(line: str) -> bool:
    return line.lstrip().startswith("|")


def is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\|?[\s:|-]+\|?", line.strip())) and "-" in line
