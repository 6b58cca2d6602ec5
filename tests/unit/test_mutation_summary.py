"""tools/mutation_summary.py: what a surviving mutant changed, from its function's source and
the original's (mutmut names them x_f__mutmut_orig and x_f__mutmut_N)."""

from __future__ import annotations

import pytest

from tools.mutation_summary import kind_of, status

ORIGINAL = 'def x_f__mutmut_orig(a):\n    if a <= 1 and ok(a, "x"):\n        return a + 1\n'


@pytest.mark.parametrize(
    ("mutant", "kind"),
    [
        ('def x_f__mutmut_1(a):\n    if a < 1 and ok(a, "x"):\n        return a + 1\n', "comparison"),
        ('def x_f__mutmut_2(a):\n    if a <= 2 and ok(a, "x"):\n        return a + 1\n', "number"),
        ('def x_f__mutmut_3(a):\n    if a <= 1 or ok(a, "x"):\n        return a + 1\n', "boolean"),
        ('def x_f__mutmut_4(a):\n    if a <= 1 and ok(a, "XXxXX"):\n        return a + 1\n', "string"),
        ('def x_f__mutmut_5(a):\n    if a <= 1 and ok(None, "x"):\n        return a + 1\n', "value -> None"),
        ('def x_f__mutmut_6(a):\n    if a <= 1 and ok(a, "x"):\n        return a - 1\n', "arithmetic"),
        (
            'def x_f__mutmut_7(a):\n    if a <= 1 and ok("x"):\n        return a + 1\n',
            "argument or call removed",
        ),
    ],
)
def test_the_kind_is_the_first_changed_token_past_mutmuts_names(mutant: str, kind: str) -> None:
    assert kind_of(ORIGINAL, mutant) == kind


def test_exit_codes_read_as_mutmut_reads_them() -> None:
    assert [status(c) for c in (1, 0, 33, 36, None, 99)] == [
        "killed", "survived", "no tests", "timeout", "not checked", "suspicious",
    ]  # fmt: skip
