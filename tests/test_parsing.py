"""tests/parsing.py: the source tests' parse survives a finalizer that parses during it."""

from __future__ import annotations

import ast
import gc
import sys
from collections.abc import Iterator

import pytest
from parsing import parse
from paths import ROOT

SOURCE = (ROOT / "resumable" / "storage" / "commit.py").read_text()


class ParsesWhenCollected:
    """Freed by the garbage collector (a cycle), whose finalizer parses, as a traceback printed
    from a finalizer does on Python 3.11."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        ast.parse("x = (1 + 2) * 3")


@pytest.fixture
def collector_often() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(50)
    yield
    gc.set_threshold(*before)
    gc.collect()


def test_a_finalizer_that_parses_during_a_parse_does_not_fail_it(collector_often: None) -> None:
    for _ in range(20):
        [ParsesWhenCollected() for _ in range(20)]
        assert isinstance(parse(SOURCE), ast.Module)


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the bug this works around is CPython 3.11's")
def test_without_it_that_parse_fails_on_this_python(collector_often: None) -> None:
    failures = 0
    for _ in range(20):
        [ParsesWhenCollected() for _ in range(20)]
        try:
            ast.parse(SOURCE)
        except SystemError as e:
            failures += "recursion depth mismatch" in str(e)
    assert failures, "CPython no longer fails here: tests/parsing.py's retry may go"
