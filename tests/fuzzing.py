"""Shared pieces of the fuzz tests (tests/fuzz): strategies for hostile input and a way to drive
async, real-server code from hypothesis.

Hypothesis runs a plain function once per example. Ours talk to real servers started in the
session's event loop (the dev server, HTTP endpoints, MCP server processes), so the test awaits
`hypothesis_in_thread(fn)`: hypothesis runs in a worker thread and each example submits its
coroutine back to the session loop with `Driver.run`, which stays free to serve it meanwhile.

Case counts: each test tallies how its examples ended (`Tally`) and records them as figures.
Default runs stay small (`DEFAULT_EXAMPLES` per boundary, seconds); the `slow` variants run
`SLOW_EXAMPLES`.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import figures
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

T = TypeVar("T")
DEFAULT_EXAMPLES = 50
SLOW_EXAMPLES = 500
SIZES = [pytest.param(DEFAULT_EXAMPLES, id="quick"), pytest.param(SLOW_EXAMPLES, id="big", marks=pytest.mark.slow)]
"""Parametrise a fuzz test with this: the default suite runs the quick size, `-m slow` the big one."""


def fuzz_settings(examples: int) -> settings:
    """Settings of every fuzz test: no deadline (real I/O), no example database (no files left).

    The default suite's small runs are derandomized (the same cases every run: CI stays
    deterministic); the `slow` runs draw new cases every time, which is where new bugs turn up.
    """
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=examples <= DEFAULT_EXAMPLES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


class Driver:
    """Runs coroutines on the session loop from hypothesis's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)


async def hypothesis_in_thread(test: Callable[[Driver], None]) -> None:
    """Run a hypothesis-decorated `test(driver)` in a thread while this loop keeps serving."""
    driver = Driver(asyncio.get_running_loop())
    await asyncio.to_thread(test, driver)


class Tally(collections.Counter[str]):
    """How the cases of one fuzz boundary ended (plus any other counts a test keeps)."""

    cases = 0

    def case(self, outcome: str) -> None:
        """Count one example, ended as `outcome`."""
        self.cases += 1
        self[outcome] += 1

    def record(self, section: str, boundary: str) -> None:
        figures.record(section, boundary, cases=self.cases, **dict(sorted(self.items())))


# -- strategies ---------------------------------------------------------------------------------
def json_values(max_leaves: int = 20) -> st.SearchStrategy[Any]:
    """Any JSON value, nested."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
        max_leaves=max_leaves,
    )


def huge_strings() -> st.SearchStrategy[str]:
    """Strings far longer than anything reasonable (up to 1 MB), cheap to build."""
    return st.builds(lambda n, c: c * n, st.integers(10_000, 1_000_000), st.sampled_from(["a", "9", "{", "é", " "]))


def nested_garbage() -> st.SearchStrategy[str]:
    """Absurdly deep JSON-ish nesting (parsers that recurse must not crash)."""
    return st.builds(
        lambda n, o, c: o * n + c * n,
        st.integers(50, 100_000),
        st.sampled_from(["[", '{"a":']),
        st.sampled_from(["]", "}"]),
    )


def broken_json() -> st.SearchStrategy[str]:
    """Text that looks like JSON and is not (truncated, trailing commas, single quotes, ...)."""
    return st.one_of(
        json_values().map(lambda v: json.dumps(v)[:-1] if len(json.dumps(v)) > 1 else "{"),
        st.sampled_from(['{"a": 1,}', "{'a': 1}", '{"a": }', '{"a" 1}', "[1, 2", "nul", '{"a": NaN}', '"\\u12"']),
        st.text(max_size=60),
    )


def hostile_text() -> st.SearchStrategy[str]:
    """Everything a model may emit instead of what was asked."""
    return st.one_of(st.text(max_size=200), broken_json(), huge_strings(), nested_garbage())
