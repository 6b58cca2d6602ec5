"""The dependency rule, enforced: protocol (`extproc`) <- shared runtime (`gateway`) <- services
(`bbr`, `epp`, `globalrouter`); no runtime module imports the simulator, the benchmarks, the
tests, the artefact generators (`tools`) or the local dev stack (`devstack`, which may import
anything); no service imports another.

Inside `epp/` the wings point one way, down: the wiring at the top (`epp/*.py`,
`epp/workers/`) may import any wing; `requestcontrol` (a request's lifecycle) imports
`scheduling` and `datalayer`; `scheduling` (pure ranking) imports `datalayer`; `datalayer` (the
pool's state and what feeds it) imports no other wing and never the wiring.

Imports are read from the source (every `import` / `from` statement, also inside functions),
so a violation fails here whether or not the code path runs.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("extproc", "gateway", "bbr", "epp", "globalrouter", "pdsidecar")
# Not runtime: the simulator, the benchmarks, the tests and the local dev stack behind `make run`.
NEVER_FROM_RUNTIME = ("modelsim", "bench", "tests", "devstack", "tools")
# What each layer may import of the project (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "extproc": frozenset(),
    "gateway": frozenset({"extproc"}),
    "bbr": frozenset({"extproc", "gateway"}),
    "epp": frozenset({"extproc", "gateway"}),
    "globalrouter": frozenset({"extproc", "gateway"}),
    "pdsidecar": frozenset({"extproc", "gateway"}),
}
# The EPP's wings, lowest first: each may import those before it, none after it; the wiring (any
# other epp module) may import them all and no wing imports it.
EPP_WINGS = ("datalayer", "scheduling", "requestcontrol")


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
            if top in NEVER_FROM_RUNTIME:
                found.append(f"{name} imports {target}: runtime code never imports {top}")
            elif top in RUNTIME and top != layer and top not in ALLOWED[layer]:
                found.append(f"{name} imports {target}: {layer} may import only {sorted(ALLOWED[layer])}")
            elif layer == top == "epp" and not _wing_may_import(name, target):
                found.append(f"{name} imports {target}: inside epp/ {' <- '.join(EPP_WINGS)} <- the wiring")
    return found


def _wing(module: str) -> int:
    """The rank of an epp module's wing (`EPP_WINGS`); the wiring ranks above them all."""
    parts = module.split(".")
    return EPP_WINGS.index(parts[1]) if len(parts) > 1 and parts[1] in EPP_WINGS else len(EPP_WINGS)


def _wing_may_import(name: str, target: str) -> bool:
    return _wing(name) == len(EPP_WINGS) or _wing(target) <= _wing(name)


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
    assert {"extproc.stream", "epp.requestcontrol.processor", "bbr.router", "gateway.config"} <= set(modules)
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
        "gateway.dev": "from devstack.launch import start_local_gateway\n",
        "globalrouter.ok": "from extproc.stream import ExtProcServicer\nfrom gateway.envoy.blocks import pack\n",
        "devstack.launch": "import modelsim.fleet\nfrom epp import app\n",  # not runtime: not checked
        "epp.datalayer.up": "from epp.scheduling.request import InferenceRequest\n",
        "epp.scheduling.wired": "from epp import app\n",
        "epp.requestcontrol.down": "from epp.scheduling.base import Decision\nfrom epp.datalayer.pool import Pool\n",
    }
    assert violations(bad) == [
        "bbr.leaky imports epp.scheduling: bbr may import only ['extproc', 'gateway']",
        "epp.datalayer.up imports epp.scheduling.request: inside epp/ datalayer <- scheduling <- "
        "requestcontrol <- the wiring",
        "epp.scheduling.wired imports epp: inside epp/ datalayer <- scheduling <- requestcontrol <- the wiring",
        "epp.sim imports modelsim.engine: runtime code never imports modelsim",
        "extproc.up imports gateway.config: extproc may import only []",
        "gateway.dev imports devstack.launch: runtime code never imports devstack",
    ]


def test_the_wheel_and_the_image_leave_out_what_is_not_runtime() -> None:
    """The dev stack, the benchmarks and the tests run from the checkout only."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    shipped = {name for name in shipped if any(fnmatch.fnmatch(name, pattern) for pattern in include)}
    assert set(RUNTIME) <= shipped
    assert not shipped & {"devstack", "bench", "tests", "tools"}, shipped
    copied = set(re.findall(r"^COPY (\S+) ", (ROOT / "deploy" / "Dockerfile").read_text(), re.M))
    assert set(RUNTIME) <= copied
    assert not copied & {"devstack", "bench", "tests", "tools"}, copied
