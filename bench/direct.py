"""The direct baseline: the same env and endpoint driven by a plain asyncio loop, no Temporal.

This is what benchmax and verifiers do: one coroutine per rollout that calls the model over
HTTP, runs the tools in-process and scores the result. It renders and parses the chat exactly as
the `generate` activity does (`gymflow.envs.wire.chat`, `gymflow.activities.model.chat_body`), posts through the
activity's own HTTP client (`gymflow.activities.model.ChatEndpoint`), and applies the same tool timeout
and output bound, so the only thing gymflow adds on top of it is orchestration. Its `start` and
`turn` are also what the bare-Temporal ceiling's turns run when they do the work (bench.bare,
`BareInput.model_url`), so both do exactly the same work.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from gymflow.activities.chat_endpoint import ChatEndpoint
from gymflow.activities.env import truncate
from gymflow.activities.model import MODEL_ENDPOINT, ModelConfig, chat_body
from gymflow.envs.contract import BaseEnv, Message, Task, ToolResult, ToolSpec
from gymflow.envs.wire import chat


@dataclass
class DirectRun:
    """One rollout in progress: its id, task, conversation so far and tools."""

    rollout_id: str
    task: Task
    messages: list[Message]
    tools: list[ToolSpec]


class DirectRunner:
    """Runs rollouts of one env instance in this event loop."""

    def __init__(self, env: BaseEnv, *, max_turns: int = 100, tool_timeout_s: float = 60.0) -> None:
        self.env = env
        self.max_turns = max_turns
        self.tool_timeout_s = tool_timeout_s
        self.endpoint = ChatEndpoint(errors=MODEL_ENDPOINT)

    async def aclose(self) -> None:
        await self.endpoint.aclose()

    async def rollout(self, task: Task, model: ModelConfig) -> list[Message]:
        """One rollout; returns the conversation (the reward is computed and dropped, as a trainer would keep it)."""
        run = await self.start(f"direct-{task.id}-{uuid.uuid4().hex[:6]}", task)
        try:
            for turn in range(self.max_turns):
                if await self.turn(run, model, turn):
                    break
            await self.env.compute_reward(run.rollout_id, run.messages, task.ground_truth, task_id=task.id)
        finally:
            await self.env.release_rollout(run.rollout_id)
        return run.messages

    async def start(self, rollout_id: str, task: Task) -> DirectRun:
        """Initialise a rollout: the env's state, its tools, the opening of the conversation."""
        await self.env.init_rollout(rollout_id, **task.init_args)
        tools = await self.env.list_tools()
        messages = [Message(role="system", content=await self.env.get_system_prompt(task))]
        return DirectRun(rollout_id, task, [*messages, *task.opening_messages()], tools)

    async def turn(self, run: DirectRun, model: ModelConfig, turn: int) -> bool:
        """One turn: the model's reply and its tool calls' observations, appended; True if it was final."""
        body = chat_body(
            model,
            chat.render_messages(run.messages, run.tools, model.tool_format),
            tools=chat.render_tools(run.tools, model.tool_format),
        )
        completion = await self.endpoint.complete(model.base_url, body, timeout_s=model.request_timeout_s)
        wire = completion["choices"][0]["message"]
        reply = chat.parse_assistant_message(wire, model.tool_format, id_prefix=f"call_{turn}")
        run.messages.append(reply)
        for call in reply.tool_calls:
            result = await self._tool(run.rollout_id, call.name, call.arguments)
            text, _ = truncate(result.text, 16_000)
            observation = Message(role="tool", content=text, tool_call_id=call.id, name=call.name)
            run.messages.append(observation.model_copy(update={"is_error": result.is_error}))
        return not reply.tool_calls

    async def _tool(self, rollout_id: str, name: str, arguments: dict[str, object]) -> ToolResult:
        try:
            raw = await asyncio.wait_for(self.env.run_tool(rollout_id, name, **arguments), self.tool_timeout_s)
        except TimeoutError:
            return ToolResult(text=f"error: tool {name!r} timed out", is_error=True)
        except Exception as exc:  # a tool's bug is the model's observation, as in the activity
            return ToolResult(text=f"error: {type(exc).__name__}: {exc}", is_error=True)
        return raw if isinstance(raw, ToolResult) else ToolResult(text=str(raw))
