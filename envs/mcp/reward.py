"""Server-side reward functions: a reward that can read the rollout's files and call its tools.

A reward function has one signature, always called with keywords (benchmax's reward_fn.py
convention, so its reward functions carry over):

    def reward_fn(completion: str, ground_truth: Any, workspace: Path, mcp_client: RolloutTools,
                  **kwargs: Any) -> float | Mapping[str, float] | Reward

* `completion`: the final assistant message's text;
* `ground_truth`: the task's ground truth, as in the dataset;
* `workspace`: the rollout's workspace directory (the servers' cwd), still intact;
* `mcp_client`: the rollout's live servers (`await mcp_client.call_tool("get")`);
* `kwargs`: `messages` (the whole conversation), `rollout_id`, `task_id`, `metadata`; accept
  `**kwargs` so new keys never break a reward.

It may be sync or async. Sync ones run in a thread (a slow check must not stall the worker's
heartbeats), so they cannot await the client: write tool-calling rewards as `async def`. A float
becomes a component named after the function; a mapping contributes its components; the total
is the sum over all functions.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mcp import Client

from gymflow.envs.contract import Message, Reward, ToolResult, ToolSpec
from gymflow.envs.mcp.instance import ServerSet

RewardValue = Reward | Mapping[str, float] | float
RewardFn = Callable[..., RewardValue | Awaitable[RewardValue]]
REWARD_SIGNATURE = "reward_fn(completion, ground_truth, workspace, mcp_client, **kwargs)"
REWARD_KWARGS = (
    *("completion", "ground_truth", "workspace", "mcp_client", "messages"),
    *("rollout_id", "task_id", "metadata"),
)
"""Every keyword a reward function is called with (`score`; the last three come from the activity)."""
LIVE_KWARGS = ("workspace", "mcp_client")
"""The keywords that hand a reward the rollout's live state; a finished batch has neither."""


def final_text(messages: Sequence[Message]) -> str:
    """The text of the last assistant message (what `completion` is), or "" if there is none."""
    return next((m.content for m in reversed(messages) if m.role == "assistant"), "")


def signature_problem(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str | None:
    """Why `fn` cannot be called with these arguments (None when it can): its signature is checked
    with `inspect.Signature.bind`, nothing is called."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: it will tell when called
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return f"{getattr(fn, '__name__', 'function')}{signature}: {exc}"
    return None


def check_reward_fn(fn: Callable[..., Any]) -> str | None:
    """Why `fn` cannot be a reward function (None when it can take every keyword `score` passes)."""
    return signature_problem(fn, **dict.fromkeys(REWARD_KWARGS))


def live_parameters(fn: Callable[..., Any]) -> list[str]:
    """The live-rollout keywords (`LIVE_KWARGS`) `fn` names as parameters.

    A reward that names `workspace` or `mcp_client` reads the rollout's files or calls its tools, so
    it cannot score a stored trajectory (gymflow.envs.rescore); one that takes the conversation and
    the ground truth (and `**kwargs`) can. A library reward (gymflow.envs.mcp.library_reward) names none.
    """
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    return [name for name in LIVE_KWARGS if name in parameters]


class RolloutTools:
    """The live MCP servers of one rollout, as a reward function sees them."""

    def __init__(self, servers: ServerSet) -> None:
        self._servers = servers

    @property
    def workspace(self) -> Path:
        """The rollout's workspace directory."""
        return self._servers.workspace

    def list_tools(self) -> list[ToolSpec]:
        """The tools, under the names the model used."""
        return self._servers.specs()

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolResult:
        """Call a tool exactly as the model would; a tool failure comes back with `is_error`."""
        return await self._servers.call(name, dict(arguments or {}))

    def client(self, server: str | None = None) -> Client:
        """The raw `mcp.Client` of a server (default: the only one) for resources and prompts."""
        sessions = self._servers.sessions
        if server is None:
            if len(sessions) != 1:
                raise ValueError(f"name a server: this env has {sorted(sessions)}")
            (session,) = sessions.values()
        else:
            session = sessions[server]
        return session.client


async def score(
    fns: Sequence[RewardFn],
    *,
    messages: list[Message],
    ground_truth: Any,
    tools: RolloutTools | None,
    **kwargs: Any,
) -> Reward:
    """Run every reward function and combine them into one Reward.

    `tools` None scores a stored conversation (gymflow.envs.rescore): the functions then get neither
    `workspace` nor `mcp_client`, which only functions that name neither (`live_parameters`) do without.
    """
    completion = final_text(messages)
    components: dict[str, float] = {}
    info: dict[str, Any] = {}
    total = 0.0
    live: dict[str, Any] = {} if tools is None else {"workspace": tools.workspace, "mcp_client": tools}
    for fn in fns:
        call_kwargs = dict(completion=completion, ground_truth=ground_truth, **live, messages=messages, **kwargs)
        if inspect.iscoroutinefunction(fn):
            value = await fn(**call_kwargs)
        else:
            value = await asyncio.to_thread(fn, **call_kwargs)
            if inspect.isawaitable(value):
                value = await value
        name = getattr(fn, "__name__", "reward")
        if isinstance(value, Reward):
            components.update(value.components or {name: value.total})
            info.update(value.info)
            total += value.total
        elif isinstance(value, Mapping):
            part = Reward.of(value)
            components.update(part.components)
            total += part.total
        else:
            part = Reward.of(value)
            components[name] = part.total
            total += part.total
    return Reward(total=total, components=components, info=info)
