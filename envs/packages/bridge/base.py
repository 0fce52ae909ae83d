"""What every kind of imported env offers the bridge, and how a declared target becomes one.

An env package declares each env as a target, `module:attribute` (or a bare module for a verifiers
taskset package), in its `gymflow.envs` entry points or on `gymflow envs install --env`. The kind is
found from what the target is, never from names:

* `benchmax`: a subclass of benchmax's `BaseEnv`;
* `verifiers`: a verifiers `Taskset` subclass, or a module exporting one (a taskset package);
* `openenv`: an app made by OpenEnv's `create_app` (it serves `/ws` and `/schema`), or an OpenEnv
  `Environment` subclass whose `step` is annotated with its action and observation classes;
* `plain`: any other class with benchmax's shape (`list_tools`, `run_tool`, `compute_reward` or
  `reward_funcs`), sync or async, importing nothing of anyone's.

`Adapter` is the one interface the bridge serves, whatever the kind. Messages cross as gymflow's JSON
(`role`, `content`, `tool_calls` of `{id, name, arguments}`, `tool_call_id`, `name`); tasks leave as
gymflow `Task` JSON (`id`, `prompt`, `ground_truth`, `init_args`, `metadata`).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Iterator
from typing import Any

SYSTEM_PROMPT_KEY = "system_prompt"
"""A task's own system prompt (verifiers tasks carry one) travels in its metadata under this key."""


class EnvFault(Exception):
    """The env's machinery failed (not the model's doing): gymflow ends or recovers the rollout."""


class BadArguments(Exception):
    """The rollout's init arguments do not fit the env (a config error, never retried)."""


class Adapter:
    """One env of one kind, for one rollout (the bridge is started per rollout) or one listing."""

    kind = "plain"

    def __init__(self, target: Any, options: dict[str, Any]) -> None:
        self.target = target
        self.options = options

    async def start(self) -> None:
        """Build the env (in the warm pool, before any rollout is known)."""

    def describe(self) -> dict[str, Any]:
        """description, doc, system_prompt, env_turns, stateless (what gymflow shows and needs)."""
        doc = inspect.getdoc(self.target) or ""
        return {"description": doc.splitlines()[0] if doc else "", "doc": doc, "system_prompt": "", "env_turns": False}

    async def tools(self) -> list[dict[str, Any]]:
        """The model's tools as MCP tool dicts (`name`, `description`, `inputSchema`)."""
        return []

    async def init(self, rollout_id: str, args: dict[str, Any]) -> dict[str, Any]:
        """Set the rollout up; answers `{"placeholders": {...}}` for the prompt's `{name}`s."""
        del rollout_id, args
        return {}

    async def call(self, rollout_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """One tool call as an MCP `CallToolResult` dict (a tool's failure: `isError`)."""
        raise NotImplementedError

    async def reward(
        self, rollout_id: str, messages: list[dict[str, Any]], ground_truth: Any, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """`{"components": {name: float}, "info": {...}}`: the env's own reward of the conversation."""
        raise NotImplementedError

    async def respond(self, rollout_id: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """The env's user message(s) after a final answer, or None: the episode is over."""
        del rollout_id, messages
        return None

    async def copy_in(self, rollout_id: str, source: str, name: str | None) -> bool:
        """Copy a file into the env's own workspace; False when the env has none of its own."""
        del rollout_id, source, name
        return False

    async def copy_out(self, rollout_id: str, name: str, destination: str) -> bool:
        """Copy a file out of the env's own workspace; False when the env has none of its own."""
        del rollout_id, name, destination
        return False

    async def release(self, rollout_id: str) -> None:
        """Free the rollout (the bridge then kills whatever processes are left)."""
        del rollout_id

    async def close(self) -> None:
        """Shut the env down (bridge exit)."""

    def dataset(self, name: str, options: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The env's tasks as gymflow `Task` dicts."""
        del options
        raise LookupError(f"this {self.kind} env has no dataset {name!r}")


def load_target(target: str) -> Any:
    """`module:attribute.path` -> the object; a bare `module` -> the module."""
    module_name, _, attribute = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attribute.split(".")):
        obj = getattr(obj, part)
    return obj


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call `fn` whether it is sync or async: sync ones run in a thread (benchmax's LocalMCPEnv
    blocks on an event loop of its own), awaitable results are awaited."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def last_reply(messages: list[dict[str, Any]]) -> str:
    """The last assistant message's text (what benchmax scores as the completion)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return message_text(message)
    return ""


def first_prompt(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        if message.get("role") == "user":
            return message_text(message)
    return ""


def jsonable(value: Any) -> Any:
    """`value` as JSON data (pydantic models and dataclasses dumped, the rest as text)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return jsonable(dump(mode="json"))
    if hasattr(value, "__dataclass_fields__"):
        return {name: jsonable(getattr(value, name)) for name in value.__dataclass_fields__}
    return str(value)
