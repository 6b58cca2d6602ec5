"""The score of a `make mutation` run (mutmut's results under mutants/), per module and for the
surviving mutants by kind, as JSON (docs/reliability.md "Mutation testing" is written from it).

`python -m tools.mutation_summary [--mutants mutants] [--out summary.json]`. A mutant's kind
comes from comparing its function's source with the original's (mutmut keeps both in the
mutated module): the first changed token pair says what was mutated.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import json
import keyword
import tokenize
from collections import Counter
from pathlib import Path
from typing import Any

# mutmut's exit codes (mutmut/stats.py): what each means for the score.
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    37: "type check",
}
TIMEOUTS = {36, -24, 24, 152, 255}
COMPARE = {"<", "<=", ">", ">=", "==", "!=", "is", "in", "not"}
ARITH = {"+", "-", "*", "/", "//", "%", "**", "+=", "-=", "*=", "/=", "|", "&", "^", "<<", ">>"}
BOOLEAN = {"and", "or", "True", "False"}


def status(code: int | None) -> str:
    if code is None:
        return "not checked"
    return "timeout" if code in TIMEOUTS else STATUS.get(code, "suspicious")


def _tokens(text: str) -> list[str]:
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.string.strip()]
    except (tokenize.TokenError, IndentationError):
        return text.split()


def kind_of(original: str, mutant: str) -> str:
    """What a mutant changed, from the first differing tokens of the two function sources."""
    a, b = ([t for t in _tokens(src) if "__mutmut_" not in t] for src in (original, mutant))
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        old, new = a[i1:i2], b[j1:j2]
        changed = set(old) | set(new)
        if changed & COMPARE:
            return "comparison"
        if changed & BOOLEAN:
            return "boolean"
        if changed & ARITH:
            return "arithmetic"
        if any(t[:1].isdigit() for t in changed):
            return "number"
        if any(t[:1] in "\"'" or t[:2] in ('f"', "f'", 'b"', "b'") for t in changed):
            return "string"
        if "None" in new:
            return "value -> None"
        if "break" in changed or "continue" in changed:
            return "loop control"
        if not new or (tag == "delete"):
            return "argument or call removed"
        if all(keyword.iskeyword(t) or t.isidentifier() for t in changed):
            return "name or keyword"
        return "other"
    return "identical"


def _functions(path: Path) -> dict[str, str]:
    source = path.read_text()
    tree = ast.parse(source)
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = ast.get_source_segment(source, node) or ""
    return out


def summarize(mutants: Path) -> dict[str, Any]:
    modules: dict[str, Counter[str]] = {}
    survivors: list[dict[str, Any]] = []
    for meta_path in sorted(mutants.rglob("*.py.meta")):
        codes = json.loads(meta_path.read_text())["exit_code_by_key"]
        if not codes:
            continue
        source_path = meta_path.with_suffix("")
        module = source_path.relative_to(mutants).as_posix()
        functions = _functions(source_path)
        counts = modules.setdefault(module, Counter())
        for key, code in sorted(codes.items()):
            state = status(code)
            counts[state] += 1
            if state != "survived":
                continue
            mangled = key.rpartition(".")[2]
            original = functions.get(mangled.rpartition("__mutmut_")[0] + "__mutmut_orig", "")
            mutant = functions.get(mangled, "")
            diff = [
                line
                for line in difflib.unified_diff(original.splitlines(), mutant.splitlines(), lineterm="", n=0)
                if line[:1] in "+-" and line[:3] not in ("+++", "---") and "__mutmut_" not in line
            ]
            survivors.append(
                {"mutant": key, "module": module, "kind": kind_of(original, mutant), "diff": diff}
            )
    total = sum((c for c in modules.values()), Counter())
    return {
        "total": sum(total.values()),
        "by_status": dict(total),
        "modules": {m: dict(c) for m, c in modules.items()},
        "survivors_by_kind": dict(Counter(s["kind"] for s in survivors).most_common()),
        "survivors": survivors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="the score of a mutmut run")
    parser.add_argument("--mutants", type=Path, default=Path("mutants"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--diffs", action="store_true", help="print each surviving mutant's change")
    args = parser.parse_args()
    summary = summarize(args.mutants)
    text = json.dumps(summary, indent=1)
    if args.out:
        args.out.write_text(text)
    s = summary["by_status"]
    print(f"{summary['total']} mutants: {json.dumps(s)}; survivors by kind: {summary['survivors_by_kind']}")
    if args.diffs:
        for survivor in summary["survivors"]:
            print(f"# {survivor['mutant']} ({survivor['kind']})", *survivor["diff"], sep="\n")


if __name__ == "__main__":
    main()
