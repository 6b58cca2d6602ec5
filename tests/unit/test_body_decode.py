"""The request body's decode (extproc/body.py): the C decoder's fast path must decode, and refuse,
exactly as `json.loads` does, including the valid bodies only the standard library takes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.body import decode_json_object
from extproc.errors import ErrorResponse


def stdlib(body: bytes) -> object:
    """What the decode gave before the fast path: the object, or the refusal's code and message."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        return ("invalid_encoding", "request body is not valid UTF-8")
    except json.JSONDecodeError as exc:
        return ("invalid_json", f"request body is not valid JSON: {exc.msg} at position {exc.pos}")
    except RecursionError:
        return ("invalid_json", "request body is nested too deeply")
    if not isinstance(data, dict):
        return ("invalid_json", "request body must be a JSON object")
    return data


def decoded(body: bytes) -> object:
    out = decode_json_object(body)
    if isinstance(out, ErrorResponse):
        assert out.status == 400
        return (out.code, out.message)
    return out


EDGES = [
    b'{"a":1e400}',  # inf: only the standard library takes numbers past a double
    b'{"a":-1e400}',
    b'{"a":NaN}',
    b'{"a":Infinity,"b":-Infinity}',
    b'{"a":"\\ud800"}',  # a lone surrogate escape
    b'{"a":"\\uDFFF\\uD800"}',
    b'{"a":' + b"[" * 1100 + b"]" * 1100 + b"}",  # deeper than either decoder recurses
    b'{"a":' + b"[" * 900 + b"]" * 900 + b"}",
    b'{"a":123456789012345678901234567890,"b":-18446744073709551616}',
    b'{"a":1,"a":2}',
    b'{"a":-0.0,"b":1e-400,"c":9007199254740993.0,"d":0.30000000000000004}',
    b'{"\xc3\xa9":"\xf0\x9f\x98\x80\\ud83d\\ude00","e":"\\u0000"}',
    b'  {"a" : [ 1 , 2 ] }  \n',
    b"\xef\xbb\xbf{}",
    b'{"x":"\xff"}',
    b'{"a":"\xed\xa0\x80"}',
    b'{"a":"\t"}',
    b'{"a":1}x',
    b'{"a":01}',
    b'{"a":1.}',
    b'{"a":[1,]}',
    b"{,}",
    b"[1]",
    b'"s"',
    b"",
]


@pytest.mark.parametrize("body", EDGES)
def test_edge_bodies_decode_or_are_refused_as_by_the_standard_library(body: bytes) -> None:
    assert repr(decoded(body)) == repr(stdlib(body))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), json_values, max_size=5), st.booleans())
def test_any_object_decodes_as_by_the_standard_library(obj: dict[str, object], ascii_only: bool) -> None:
    body = json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert repr(decoded(body)) == repr(stdlib(body))
