"""Shared fixtures: in-process servicers on real gRPC, fuzz counters."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.extproc_harness import Services, start_services


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    svc = start_services()
    try:
        yield svc
    finally:
        svc.stop()


def record_figures(name: str, figures: dict[str, object]) -> None:
    """Append measured figures to $RELIABILITY_REPORT (JSON lines) when set; docs quote them."""
    target = os.environ.get("RELIABILITY_REPORT")
    if target:
        with Path(target).open("a") as fh:
            fh.write(json.dumps({"test": name, **figures}) + "\n")
