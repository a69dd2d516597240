"""``ast.parse`` for the tests that read the package's source, safe from a re-entrant parse.

CPython 3.11 keeps the AST constructor's recursion depth in per-interpreter state (gh-106905): a
parse during which the garbage collector runs a finalizer that parses too fails with
``SystemError: AST constructor recursion depth mismatch``. Python 3.11 parses source to underline
a traceback it prints, and asyncio prints one from a task's finalizer ("Task exception was never
retrieved": an earlier test's Orbax tasks, in the same pytest worker, once failed test_layers so).
That is not the source's fault: the parse is tried again, the garbage gone.
"""

from __future__ import annotations

import ast

ATTEMPTS = 5


def parse(source: str) -> ast.Module:
    for attempt in range(ATTEMPTS):
        try:
            return ast.parse(source)
        except SystemError as e:
            if "recursion depth mismatch" not in str(e) or attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
