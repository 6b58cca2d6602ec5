"""One home per kind of result (issue #53): the three summary roots, and campaign folders each with
a manifest generated from its files and an index page (bench/reports/campaigns.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench.reports.campaigns import (
    CAMPAIGNS,
    INDEX,
    MANIFEST,
    NOT_RECORDED,
    dump,
    main,
    manifest,
    manifests,
    render_index,
)

REPO = Path(__file__).resolve().parents[2]
SUMMARY_ROOTS = {"bench/summaries", "bench/summaries-virtual", "bench/summaries-virtual-replicas"}
REGENERATE = "run `python -m bench.reports.campaigns --write` and commit"


def _tracked() -> list[str]:
    return subprocess.run(
        ["git", "ls-files", "bench"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()


def test_every_campaign_has_its_generated_manifest_and_the_index_lists_them() -> None:
    found = manifests(REPO)
    for name, m in found.items():
        path = REPO / CAMPAIGNS / name / MANIFEST
        assert path.is_file() and path.read_text() == dump(m), f"{path}: {REGENERATE}"
    assert (REPO / INDEX).read_text() == render_index(found), f"{INDEX}: {REGENERATE}"


def test_no_campaign_stays_that_no_page_or_code_cites() -> None:
    uncited = [
        n for n, m in manifests(REPO).items() if m["evidence_for"] == NOT_RECORDED and not m["read_by"]
    ]
    assert not uncited, f"superseded campaigns (git keeps them): git rm -r {' '.join(uncited)}"


def test_bench_has_three_summary_roots_and_campaign_folders() -> None:
    """Every committed run summary is in one of the three roots or in a campaign folder; nothing
    but the index lies loose in bench/results-committed."""
    roots, loose = set(), []
    for path in _tracked():
        parts = path.split("/")
        if parts[1] == CAMPAIGNS.name and len(parts) == 3 and path != INDEX.as_posix():
            loose.append(path)
        if parts[-1].startswith("seed-") and parts[1] != CAMPAIGNS.name:
            roots.add("/".join(parts[:2]))
    assert roots <= SUMMARY_ROOTS, roots
    assert not loose, f"put each campaign in a folder of its own: {loose}"


def test_a_manifest_says_what_the_folder_records(tmp_path: Path) -> None:
    campaign = tmp_path / CAMPAIGNS / "2026-12-07-toy"
    run = campaign / "quick" / "uniform" / "epp-default"
    run.mkdir(parents=True)
    summary = {
        "policy": {"name": "epp-default", "config": {"default_revision": 3}},
        "env": {"git": {"commit": "0123456789abcdef"}, "platform": "Linux", "cpu_count": 2, "python": "3.11"},
        "run": {"command": ["python", "-m", "bench", "run", "--seed", "1"]},
    }
    (run / "seed-1.json").write_text(json.dumps(summary))
    m = manifest(campaign, ["docs/benchmarks/x.md § Toy section"])
    assert m["commit"] == ["0123456789ab"] and m["default_revision"] == ["3"] and m["clock"] == ["real time"]
    assert m["command"] == ["python -m bench run --seed 1"] and m["machine"] == ["2 CPUs, Linux, Python 3.11"]
    assert m["title"] == "Toy section" and m["evidence_for"] == ["docs/benchmarks/x.md § Toy section"]
    # Cited by no page: the check names it.
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench" / "x.py").write_text("")
    assert main(["--root", str(tmp_path)]) == 1
    (tmp_path / "docs" / "x.md").write_text("# Toy\n\nSee bench/results-committed/2026-12-07-toy.\n")
    assert main(["--root", str(tmp_path)]) == 0
