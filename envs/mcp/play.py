"""Play a policy against an env's real MCP servers in one process, without Temporal.

The same path a workflow takes (init_rollout, run_tool per call, compute_reward, release): what the
env tests and quick local checks use, for any `McpEnv`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from gymflow.envs.contract import Message, Reward, Task, ToolCall, ToolResult
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.policy import Policy, converse


async def play(env: McpEnv, policy: Policy, task: Task, *, max_turns: int = 8) -> tuple[list[Message], Reward]:
    """One rollout of `policy` on `task` against `env`'s real MCP servers, without Temporal.

    The same path a workflow takes (init_rollout, run_tool per call, compute_reward, release), in
    one process: what the tests and quick local checks use.
    """
    rollout_id = f"play-{task.id}-{uuid.uuid4().hex[:6]}"
    await env.init_rollout(rollout_id, **task.init_args)
    try:
        tools = await env.list_tools()
        messages = [Message(role="system", content=await env.get_system_prompt(task)), *task.opening_messages()]

        async def run(call: ToolCall) -> tuple[str, bool]:
            result = await env.run_tool(rollout_id, call.name, **call.arguments)
            return (result.text, result.is_error) if isinstance(result, ToolResult) else (str(result), False)

        await converse(policy, messages, tools, run, max_turns=max_turns)
        reward = Reward.of(await env.compute_reward(rollout_id, messages[1:], task.ground_truth))
    finally:
        await env.release_rollout(rollout_id)
    return messages, reward


async def play_tasks(env: McpEnv, policy: Policy, tasks: Sequence[Task], *, concurrency: int = 4) -> list[Reward]:
    """Play every task (up to `concurrency` at once); one reward per task, in order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> Reward:
        async with gate:
            return (await play(env, policy, task))[1]

    return list(await asyncio.gather(*(one(t) for t in tasks)))
