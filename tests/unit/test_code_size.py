"""Shipped modules stay small enough to read: at most 500 lines per module, 80 per function,
in the services and the shared runtime (epp/, bbr/, gateway/), and at most 10 entries at the
top of epp/ (the wiring beside its wings, docs/architecture.md).

A module that grows past the limit is split by concern (epp/datalayer/pool.py holds the
mutable `Pool`, epp/datalayer/endpoint_records.py the records it hands out; gateway/envoy/ the
routes, the clusters and the bootstrap apart); a function, into named steps (epp/app.py
`EppApp`'s builders)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("epp", "bbr", "gateway")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_EPP_TOP_LEVEL = 10


def _shipped_modules() -> list[Path]:
    return sorted(
        p
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    )


def long_modules(paths: list[Path]) -> dict[str, int]:
    out = {}
    for path in paths:
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            out[path.relative_to(ROOT).as_posix()] = lines
    return out


def long_functions(source: str, name: str) -> list[str]:
    """`module:function (lines)` for each function of `source` over the limit."""
    return [
        f"{name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_shipped_module_is_over_the_limit() -> None:
    assert long_modules(_shipped_modules()) == {}


def test_no_shipped_function_is_over_the_limit() -> None:
    found = [
        line
        for path in _shipped_modules()
        for line in long_functions(path.read_text(), path.relative_to(ROOT).as_posix())
    ]
    assert found == []


def test_the_epp_top_level_is_the_wiring_and_its_wings() -> None:
    entries = sorted(p.name for p in (ROOT / "epp").iterdir() if p.name != "__pycache__")
    assert len(entries) <= MAX_EPP_TOP_LEVEL, entries
    assert {"datalayer", "scheduling", "requestcontrol"} <= set(entries)


def test_a_long_function_is_reported() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def long():\n{body}\n\ndef short():\n    pass\n", "m") == [
        f"m:long ({MAX_FUNCTION_LINES + 1} lines)"
    ]
