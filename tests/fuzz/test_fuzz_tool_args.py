"""Fuzzed tool calls through the real `call_tool` activity into the real MCP calculator and counter
server processes: wrong types, missing and extra arguments, huge and deeply nested values, unknown
tools. Each one comes back as a tool result or an error observation for the model; no call kills
a server or fails the activity (which would make a model's typo look like an infrastructure fault).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fuzzing import SIZES, Driver, Tally, fuzz_settings, huge_strings, hypothesis_in_thread, json_values
from hypothesis import given
from hypothesis import strategies as st
from temporalio.testing import ActivityEnvironment

from gymflow.activities.env import EnvActivities
from gymflow.activities.env_schema import CallToolInput, InitRolloutInput, RolloutHandle
from gymflow.envs.contract import Message, Reward, Task, ToolCall
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.registry import register
from support import COUNTER_SERVER

PARAMS = {
    "add": ["a", "b"],
    "subtract": ["a", "b"],
    "multiply": ["a", "b"],
    "divide": ["a", "b"],
    "power": ["base", "exponent"],
    "sqrt": ["x"],
    "evaluate": ["expression"],
    "increment": ["by", "tag"],
    "get": [],
    "pid": [],
    "list_files": [],
}
"""The tools fuzzed, with their parameters (`sleep`, `blob`, `image` and `write_note` are left out:
their job is to hang, to allocate or to write files, which the fuzzer would only make them do)."""


LEFT_OUT = {"sleep", "blob", "image", "write_note"}


class FuzzToolsEnv(McpEnv):
    name = "fuzz-tools"
    mcp_servers = {
        "calculator": {
            "command": "python",
            "args": ["-m", "gymflow.envs.builtin.math.servers.calculator"],
            "tool_timeout_s": 10,
        },
        "counter": {"command": "python", "args": [str(COUNTER_SERVER)], "tool_timeout_s": 10},
    }

    async def compute_reward(self, rollout_id: str, completion: list[Message], ground_truth: Any, **kw: Any) -> Reward:
        return Reward(total=0.0)


register(FuzzToolsEnv.name, FuzzToolsEnv)


def values() -> st.SearchStrategy[Any]:
    numbers = st.one_of(
        st.integers(),
        st.integers(min_value=-(10**400), max_value=10**400),
        st.floats(),  # NaN and infinities included
        st.sampled_from([0, -0.0, 1e308, 5e-324, 2**63, -(2**63) - 1]),
    )
    text = st.one_of(
        st.text(max_size=50), huge_strings(), st.sampled_from(["9**9**9", "1/0", "sqrt(-1)", "__import__('os')"])
    )
    return st.one_of(numbers, text, json_values(), st.builds(lambda n: [[[]]] * n, st.integers(0, 50)))


def tool_call() -> st.SearchStrategy[ToolCall]:
    unknown = st.sampled_from(["", "rm", "ADD", "add ", "calculator__add"]) | st.text(max_size=20)
    names = st.sampled_from(sorted(PARAMS)) | unknown.filter(lambda n: n not in LEFT_OUT)

    def arguments(name: str) -> st.SearchStrategy[dict[str, Any]]:
        known = PARAMS.get(name, [])
        keys = st.sampled_from([*known, "extra", "", "__proto__"]) if known else st.text(max_size=10)
        well_typed = st.fixed_dictionaries({k: st.integers(-1000, 1000) | st.floats(-1e6, 1e6) for k in known})
        return st.one_of(well_typed, st.dictionaries(keys, values(), max_size=4))

    return names.flatmap(
        lambda name: arguments(name).map(lambda args: ToolCall(id=uuid.uuid4().hex[:8], name=name, arguments=args))
    )


@pytest.fixture
async def rollout(tmp_path: Path) -> AsyncIterator[tuple[EnvActivities, RolloutHandle]]:
    activities = EnvActivities(node_id="fuzz", node_queue="fuzz@node", workspace_root=tmp_path)
    handle = await ActivityEnvironment().run(
        activities.init_rollout, InitRolloutInput(env=FuzzToolsEnv.name, rollout_id="r", task=Task(id="t", prompt="p"))
    )
    yield activities, handle
    await activities.shutdown()


async def call(activities: EnvActivities, handle: RolloutHandle, tool: ToolCall, tally: Tally) -> None:
    result = await ActivityEnvironment().run(
        activities.call_tool, CallToolInput(env=FuzzToolsEnv.name, state_key=handle.state_key, call=tool, timeout_s=10)
    )  # an ApplicationError here (the server died, the activity failed) fails the test
    assert isinstance(result.text, str) and len(result.text) <= 16_000 + 100
    if not result.is_error:
        assert tool.name in PARAMS, (tool, result)
    tally.case("error_observation" if result.is_error else "result")


@pytest.mark.parametrize("examples", SIZES)
async def test_fuzzed_tool_calls_are_results_or_error_observations(
    rollout: tuple[EnvActivities, RolloutHandle], examples: int
) -> None:
    activities, handle = rollout
    env = activities.env(FuzzToolsEnv.name)
    assert isinstance(env, McpEnv)
    pids = env.server_pids(handle.state_key)
    tally = Tally()

    @fuzz_settings(examples)
    @given(tool=tool_call())
    def check(driver: Driver, tool: ToolCall) -> None:
        driver.run(call(activities, handle, tool, tally))

    await hypothesis_in_thread(check)
    assert env.server_pids(handle.state_key) == pids and env._get(handle.state_key).alive  # no server died
    sanity = await env.run_tool(handle.state_key, "add", a=0.1, b=0.2)
    assert sanity.text == "0.3" and math.isfinite(float(sanity.text))
    tally.record("fuzz", f"tool arguments -> MCP calculator + counter ({examples} examples)")
