"""safe_json: JSON read from a run folder is bounded in size and depth and strict in what it accepts."""

from __future__ import annotations

import json

import pytest

from resumable.core import safe_json
from resumable.core.safe_json import MAX_DEPTH, RefusedJSON, loads

LIMIT = 1024


def nested(depth: int, opener: str = "[", closer: str = "]") -> bytes:
    return (opener * depth + closer * depth).encode()


def nested_objects(depth: int) -> bytes:
    return ('{"a":' * depth + "1" + "}" * depth).encode()


# Each hostile input, with a fragment of the one-line reason it is refused for.
HOSTILE = {
    "too-large": (b"[" + b"0," * 600 + b"0]", "larger than any real one"),
    "utf16-bom": ('{"a": 1}'.encode("utf-16"), "UTF-16 or UTF-32"),
    "utf16-le-no-bom": ('{"a": 1}'.encode("utf-16-le"), "UTF-16 or UTF-32"),
    "utf16-be-no-bom": ('{"a": 1}'.encode("utf-16-be"), "UTF-16 or UTF-32"),
    "utf32-bom": ('{"a": 1}'.encode("utf-32"), "UTF-16 or UTF-32"),
    "utf32-be-no-bom": ('{"a": 1}'.encode("utf-32-be"), "UTF-16 or UTF-32"),
    "utf8-bom": ('{"a": 1}'.encode("utf-8-sig"), "byte-order mark"),
    "latin1": ('{"a": "caf\u00e9"}'.encode("latin-1"), "not UTF-8"),
    "nan": (b'{"a": NaN}', "holds NaN"),
    "infinity": (b'{"a": Infinity}', "holds Infinity"),
    "minus-infinity": (b'{"a": [-Infinity]}', "holds -Infinity"),
    "1e400": (b'{"a": 1e400}', "too large for a float"),
    "minus-1e400": (b'{"a": -1e400}', "too large for a float"),
    "400-digit-int": (b'{"a": ' + b"9" * 400 + b"}", "integer of 400 digits"),
    "duplicate-key": (b'{"epoch": 1, "epoch": 2}', "key 'epoch' twice"),
    "nested-duplicate-key": (b'{"files": {"a": 1, "b": 2, "a": 3}}', "key 'a' twice"),
    "deep-lists": (nested(MAX_DEPTH + 1), f"more than {MAX_DEPTH} levels"),
    "deep-objects": (nested_objects(MAX_DEPTH + 1), f"more than {MAX_DEPTH} levels"),
    "recursion-limit": (nested(400), "more than"),  # either check: never a RecursionError
    "lone-surrogate": (b'{"a": "\\ud800"}', "unpaired UTF-16 surrogate"),
    "lone-low-surrogate-key": (b'{"\\udc00": 1}', "unpaired UTF-16 surrogate"),
    "empty": (b"", "not valid JSON"),
    "truncated": (b'{"a": [1, 2', "not valid JSON"),
    "trailing-garbage": (b'{"a": 1} x', "not valid JSON"),
}


@pytest.mark.parametrize(("data", "reason"), HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_json_is_refused_with_one_line(data: bytes, reason: str) -> None:
    with pytest.raises(RefusedJSON, match=reason) as caught:
        loads(data, LIMIT)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200
    assert isinstance(caught.value, ValueError)  # callers that catch ValueError keep working


@pytest.mark.parametrize("depth", [2_000, 100_000, 1_000_000])
def test_nesting_thousands_deep_is_refused_not_a_crash(depth: int) -> None:
    for data in (nested(depth), nested(depth, "{", "}"), nested_objects(depth)):
        for thorough in (True, False):
            with pytest.raises(RefusedJSON, match="nested|not valid JSON"):
                loads(data, 10 * depth, thorough=thorough)


def test_an_integer_over_pythons_digit_limit_is_refused_in_a_few_words() -> None:
    data = b"[" + b"9" * 5000 + b"]"
    for thorough in (True, False):
        with pytest.raises(RefusedJSON, match="digits") as caught:
            loads(data, 10_000, thorough=thorough)
        assert "set_int_max_str_digits" not in str(caught.value)  # Python's advice is not ours to give


def test_good_json_reads_as_json_does() -> None:
    deep = json.loads(nested(MAX_DEPTH - 1))
    doc = {"a": [1, 2.5, None, True, "caf\u00e9 \U0001f600", {"b": -3}], "deep": deep}
    for text in (json.dumps(doc), json.dumps(doc, ensure_ascii=False)):  # \ud83d\ude00 pairs, and raw UTF-8
        assert loads(text.encode(), LIMIT) == doc
    assert loads(nested(MAX_DEPTH), LIMIT) == json.loads(nested(MAX_DEPTH))
    assert loads(b'{"a": ' + b"9" * 64 + b"}", LIMIT) == {"a": int("9" * 64)}
    assert loads(b"[1e308, -1e308, 5e-324]", LIMIT) == [1e308, -1e308, 5e-324]


def test_the_limit_is_inclusive() -> None:
    data = b'"' + b"a" * (LIMIT - 2) + b'"'
    assert len(data) == LIMIT and loads(data, LIMIT) == "a" * (LIMIT - 2)
    with pytest.raises(RefusedJSON, match="larger than any real one"):
        loads(data + b" ", LIMIT)


def test_the_quick_parse_keeps_the_cheap_checks_only() -> None:
    """The run index's parse: NaN, encoding, size and the parser's own depth limit still refused."""
    assert loads(b'{"a": 1, "a": 2}', LIMIT, thorough=False) == {"a": 2}
    assert loads(nested(MAX_DEPTH + 1), LIMIT, thorough=False) is not None
    for data in (b"[NaN]", b"[Infinity]", "[1]".encode("utf-16"), b"[" + b"0," * 600 + b"0]"):
        with pytest.raises(RefusedJSON):
            loads(data, LIMIT, thorough=False)
    with pytest.raises(RefusedJSON, match="nested too deep"):
        loads(nested(5_000), 10_000, thorough=False)


def test_every_limit_has_headroom_over_what_resumable_writes() -> None:
    assert safe_json.MANIFEST_LIMIT >= 16 * 2**20 and safe_json.INDEX_LIMIT >= 64 * 2**20
    assert safe_json.STATE_LIMIT >= 64 * 2**20 and safe_json.RECORD_LIMIT >= 2**20
    assert safe_json.LEASE_LIMIT >= 2**16
