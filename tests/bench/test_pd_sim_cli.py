"""`python -m bench.probes.pd_sim --out PAGE` refuses a page it cannot write into at once, with
one line and exit status 2, before minutes of simulation (issue #55's smaller items)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.probes import pd_sim


def test_a_missing_out_page_is_refused_before_any_simulation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(pd_sim, "table", lambda seeds: pytest.fail("simulated before checking --out"))
    with pytest.raises(SystemExit) as exit_:
        pd_sim.main(["--out", str(tmp_path / "missing.md")])
    assert exit_.value.code == 2
    assert "cannot read --out" in capsys.readouterr().err


def test_a_page_without_the_markers_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "page.md"
    page.write_text("# no markers\n")
    monkeypatch.setattr(pd_sim, "table", lambda seeds: pytest.fail("simulated before checking --out"))
    with pytest.raises(SystemExit) as exit_:
        pd_sim.main(["--out", str(page)])
    assert exit_.value.code == 2


def test_the_tables_go_between_the_markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "page.md"
    start, end = pd_sim.MARKERS
    page.write_text(f"before\n{start}\nold\n{end}\nafter\n")
    monkeypatch.setattr(pd_sim, "table", lambda seeds: "new")
    assert pd_sim.main(["--out", str(page), "--seeds", "1"]) == 0
    assert page.read_text() == f"before\n{start}\nnew\n{end}\nafter\n"
