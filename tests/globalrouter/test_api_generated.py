"""The checked-in gRPC code is what `make proto` generates from proto/ (same command, pinned grpcio-tools)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path("globalrouter/api/v1")


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proto" / PACKAGE).glob("*.proto"))
    assert protos, "no .proto under proto/globalrouter/api/v1"
    out = str(tmp_path)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Iproto",
         f"--python_out={out}", f"--grpc_python_out={out}", f"--pyi_out={out}", *protos],
        cwd=ROOT, check=True, timeout=60,
    )  # fmt: skip
    generated = sorted(p.name for p in (tmp_path / PACKAGE).iterdir())
    committed = sorted(p.name for p in (ROOT / PACKAGE).iterdir() if p.name != "__init__.py" and p.is_file())
    assert generated == committed
    for name in generated:
        assert (tmp_path / PACKAGE / name).read_text() == (ROOT / PACKAGE / name).read_text(), (
            f"{PACKAGE / name} is stale: run `make proto` and commit"
        )
