"""The dependency rule, enforced: protocol (`extproc`) <- shared runtime (`gateway`) <- services
(`bbr`, `epp`, `globalrouter`); no runtime module imports the simulator, the benchmarks, the
tests or the local dev harness; no service imports another.

Imports are read from the source (every `import` / `from` statement, also inside functions),
so a violation fails here whether or not the code path runs.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("extproc", "gateway", "bbr", "epp", "globalrouter")
# The local dev harness behind `make run` and the tests: it may import anything runtime.
HARNESS = frozenset({"gateway.launch", "gateway.run", "gateway.certs", "globalrouter.launch"})
NEVER_FROM_RUNTIME = ("modelsim", "bench", "tests")
# What each layer may import of the project (besides itself and the harness rules above).
ALLOWED: dict[str, frozenset[str]] = {
    "extproc": frozenset(),
    "gateway": frozenset({"extproc"}),
    "bbr": frozenset({"extproc", "gateway"}),
    "epp": frozenset({"extproc", "gateway"}),
    "globalrouter": frozenset({"extproc", "gateway"}),
}


def imported_modules(source: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def violations(modules: dict[str, str]) -> list[str]:
    """`modules` maps a dotted module name to its source; returns one line per broken rule."""
    found = []
    for name, source in sorted(modules.items()):
        layer = name.split(".")[0]
        if layer not in RUNTIME:
            continue
        for target in sorted(imported_modules(source)):
            top = target.split(".")[0]
            if top in NEVER_FROM_RUNTIME and name not in HARNESS:
                found.append(f"{name} imports {target}: runtime code never imports {top}")
            elif top in RUNTIME and top != layer:
                if target in HARNESS and name not in HARNESS:
                    found.append(f"{name} imports the dev harness {target}")
                elif top not in ALLOWED[layer] and name not in HARNESS:
                    found.append(f"{name} imports {target}: {layer} may import only {sorted(ALLOWED[layer])}")
            elif target in HARNESS and name not in HARNESS:
                found.append(f"{name} imports the dev harness {target}")
    return found


def tree_modules() -> dict[str, str]:
    out = {}
    for package in RUNTIME:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path.read_text()
    return out


def test_the_tree_follows_the_dependency_rule() -> None:
    modules = tree_modules()
    assert {"extproc.stream", "epp.processor", "bbr.router", "gateway.config"} <= set(modules)
    assert violations(modules) == []


def test_bbr_loads_neither_the_epp_nor_kubernetes() -> None:
    """Measured on the real import graph, not the source: what `python -m bbr` loads."""
    code = (
        "import sys, bbr.__main__; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('epp', 'kubernetes', 'xxhash')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_bad_module_is_reported() -> None:
    bad = {
        "bbr.leaky": "from epp.scheduling import scorers\n",
        "epp.sim": "def f():\n    import modelsim.engine\n",
        "extproc.up": "from gateway.config import GatewayConfig\n",
        "gateway.dev": "from gateway.launch import start_local_gateway\n",
        "globalrouter.ok": "from extproc.stream import ExtProcServicer\nfrom gateway.envoy_blocks import TYPES\n",
        "gateway.launch": "import modelsim.fleet\nfrom epp import app\n",  # the harness may
    }
    assert violations(bad) == [
        "bbr.leaky imports epp.scheduling: bbr may import only ['extproc', 'gateway']",
        "epp.sim imports modelsim.engine: runtime code never imports modelsim",
        "extproc.up imports gateway.config: extproc may import only []",
        "gateway.dev imports the dev harness gateway.launch",
    ]
