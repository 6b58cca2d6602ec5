"""One check's outcome, and the markdown the checks are reported in."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Check:
    """A named check: `ok` unless one of its steps failed; `lines` say what was seen."""

    title: str
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def saw(self, line: str) -> None:
        self.lines.append(line)

    def expect(self, condition: bool, what: str, detail: str = "") -> bool:
        """Record `what` as passed or failed (with `detail`); returns `condition`."""
        if condition:
            self.lines.append(f"ok: {what}")
        else:
            self.failures.append(f"{what}{': ' + detail if detail else ''}")
            self.lines.append(f"FAILED: {what}{': ' + detail if detail else ''}")
        return condition


def markdown(header: str, checks: list[Check]) -> str:
    out = [header.rstrip(), ""]
    for check in checks:
        out += [f"## {check.title}: {'passed' if check.ok else 'FAILED'}", ""]
        out += [f"- {line}" for line in check.lines]
        out.append("")
    return "\n".join(out)
