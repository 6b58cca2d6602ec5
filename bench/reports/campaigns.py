"""One manifest per campaign folder of bench/results-committed/, and the index page of them all.

A campaign folder holds the outputs of one run of the benchmarks that is evidence for a claim of a
committed page but is not a row of the current summaries (bench/summaries real time,
bench/summaries-virtual and bench/summaries-virtual-replicas virtual time): a before/after pair,
a tuning round, a probe's output. Its `manifest.json` is generated from what the folder holds, so
it cannot drift from it:

- commit, default revision, command and machine: as the run summaries in it record them (`env.git`,
  `policy.config.default_revision`, `run.command`, `env`), else as its other JSON outputs and its
  README name them ("not recorded" where nothing does);
- evidence for: every committed page (and the section) that cites the folder, and the bench code
  that reads it.

A folder no committed page or code cites is superseded: it goes (git keeps it).
`python -m bench.reports.campaigns --write` rewrites the manifests and `INDEX`;
tests/bench/test_campaigns.py holds the committed ones to the generated.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

CAMPAIGNS = Path("bench/results-committed")
MANIFEST = "manifest.json"
INDEX = CAMPAIGNS / "README.md"
NOT_RECORDED = "not recorded"
MAX_COMMANDS = 8
_HEX = re.compile(r"(?<![0-9a-z])[0-9a-f]{7,40}(?![0-9a-z])")
_CITE = re.compile(r"results-committed/([\w.@-]+)")
_COMMAND = re.compile(r"python -m bench[^`\n]*")


def campaigns(repo: Path) -> list[Path]:
    return sorted(p for p in (repo / CAMPAIGNS).iterdir() if p.is_dir())


def citations(repo: Path) -> dict[str, list[str]]:
    """Campaign name -> where it is cited: `page § heading` for the pages under docs/ and the
    README, the module path for bench code (the campaigns' own files left out)."""
    found: dict[str, list[str]] = {}
    pages = [repo / "README.md", *sorted((repo / "docs").glob("**/*.md"))]
    for page in (p for p in pages if p.is_file()):
        heading = ""
        for line in page.read_text().splitlines():
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            for name in _CITE.findall(line):
                where = f"{page.relative_to(repo).as_posix()} § {heading}" if heading else page.name
                found.setdefault(name.rstrip("."), []).append(where)
    for module in sorted((repo / "bench").glob("**/*.py")):
        if CAMPAIGNS.as_posix() in module.relative_to(repo).as_posix():
            continue
        for name in _CITE.findall(module.read_text()):
            found.setdefault(name.rstrip("."), []).append(module.relative_to(repo).as_posix())
    return {name: list(dict.fromkeys(where)) for name, where in found.items()}


def _walk(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key), item
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def _record(data: Any, out: dict[str, set[str]]) -> None:
    """What one JSON output of the folder records about its run."""
    if isinstance(data, Mapping) and "policy" in data and "env" in data:  # a run summary
        env = data.get("env") or {}
        commit = (env.get("git") or {}).get("commit")
        if commit:
            out["commit"].add(str(commit)[:12])
        revision = (data["policy"].get("config") or {}).get("default_revision")
        if revision is not None:
            out["default_revision"].add(str(revision))
        command = (data.get("run") or {}).get("command")
        if command:
            out["command"].add(" ".join(map(str, command)))
        if env.get("platform"):
            out["machine"].add(f"{env.get('cpu_count')} CPUs, {env['platform']}, Python {env.get('python')}")
        out["clock"].add("virtual time" if (data.get("run") or {}).get("virtual") else "real time")
        return
    for key, value in _walk(data):
        if key == "commit" and isinstance(value, str) and _HEX.fullmatch(value):
            out["commit"].add(value[:12])
        elif key == "default_revision" and value is not None:
            out["default_revision"].add(str(value))
        elif key == "command" and value:
            out["command"].add(" ".join(map(str, value)) if isinstance(value, list) else str(value))
        elif key in ("cpu_count", "cpus") and isinstance(value, int):
            out["machine"].add(f"{value} CPUs")


def _from_text(folder: Path, out: dict[str, set[str]]) -> str:
    """Its README's (or notes') commits and commands, and its title line."""
    title = ""
    for note in sorted(folder.glob("*.md")):
        text = note.read_text()
        if not title:
            title = next((line.lstrip("# ").strip() for line in text.splitlines() if line.strip()), "")
        if not out["commit"]:
            out["commit"].update(m[:12] for m in _HEX.findall(text))
        if not out["command"]:
            out["command"].update(m.strip().rstrip(".;,") for m in _COMMAND.findall(text))
    tail = folder.name.rsplit("-", 1)[-1]
    if not out["commit"] and _HEX.fullmatch(tail):
        out["commit"].add(tail)
    return title


def manifest(folder: Path, cited: list[str]) -> dict[str, Any]:
    """The folder's manifest, from its files alone (and where it is cited)."""
    out: dict[str, set[str]] = {
        k: set() for k in ("commit", "default_revision", "command", "machine", "clock")
    }
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    for path in files:
        if path.suffix == ".json":
            try:
                _record(json.loads(path.read_text()), out)
            except ValueError:
                continue
    title = _from_text(folder, out)
    commands = sorted(out["command"])
    pages = [w for w in cited if w.startswith(("docs/", "README"))]
    return {
        "campaign": folder.name,
        "title": title or (pages[0].partition(" § ")[2] if pages else NOT_RECORDED),
        "files": len(files),
        "clock": sorted(out["clock"]) or NOT_RECORDED,
        "commit": sorted(out["commit"]) or NOT_RECORDED,
        "default_revision": sorted(out["default_revision"]) or NOT_RECORDED,
        "command": commands[:MAX_COMMANDS] or NOT_RECORDED,
        "commands_not_shown": max(0, len(commands) - MAX_COMMANDS),
        "machine": sorted(out["machine"]) or NOT_RECORDED,
        "evidence_for": pages or NOT_RECORDED,
        "read_by": [w for w in cited if w.startswith("bench/")],
    }


def manifests(repo: Path) -> dict[str, dict[str, Any]]:
    cites = citations(repo)
    return {folder.name: manifest(folder, cites.get(folder.name, [])) for folder in campaigns(repo)}


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if value else "-"
    return str(value)


def render_index(found: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [
        "# Campaigns (generated)",
        "",
        "Results of runs that are evidence for a page but are not rows of the current summaries",
        "(`bench/summaries`: real time, the headline; `bench/summaries-virtual` and",
        "`bench/summaries-virtual-replicas`: virtual time). Each folder has a `manifest.json`:",
        "commit, default revision, command and machine as its files record them, and the pages",
        "it is evidence for. Generated by `python -m bench.reports.campaigns --write`; a folder no",
        "page cites is removed (git keeps it).",
        "",
        "| campaign | what | clock | commit | default_revision | evidence for |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in found.items():
        evidence = (
            m["evidence_for"] if isinstance(m["evidence_for"], list) else [m["read_by"] or NOT_RECORDED]
        )
        lines.append(
            f"| [`{name}`]({name}/{MANIFEST}) | {m['title']} | {_cell(m['clock'])} | {_cell(m['commit'])} "
            f"| {_cell(m['default_revision'])} | {'; '.join(map(_cell, evidence))} |"
        )
    return "\n".join(lines) + "\n"


def dump(m: Mapping[str, Any]) -> str:
    return json.dumps(m, indent=1, ensure_ascii=False) + "\n"


def write(repo: Path) -> list[Path]:
    found = manifests(repo)
    written = []
    for name, m in found.items():
        path = repo / CAMPAIGNS / name / MANIFEST
        path.write_text(dump(m))
        written.append(path)
    (repo / INDEX).write_text(render_index(found))
    return [*written, repo / INDEX]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write the manifests and {INDEX}")
    parser.add_argument("--root", default=".")
    args = parser.parse_args(argv)
    repo = Path(args.root)
    if args.write:
        print(f"wrote {len(write(repo))} file(s)")
        return 0
    found = manifests(repo)
    uncited = [n for n, m in found.items() if m["evidence_for"] == NOT_RECORDED and not m["read_by"]]
    print(render_index(found))
    if uncited:
        print(f"cited by no page or code (superseded: remove): {', '.join(uncited)}", file=sys.stderr)
    return 1 if uncited else 0


if __name__ == "__main__":
    sys.exit(main())
