"""The direct baseline: the same env and endpoint driven by a plain asyncio loop, no Temporal.

This is what benchmax and verifiers do: one coroutine per rollout that calls the model over
HTTP, runs the tools in-process and scores the result. It renders and parses the chat exactly as
the `generate` activity does (`envs.chat`, `activities.model.chat_body`), posts through the
activity's own HTTP client (`activities.model.ChatEndpoint`), and applies the same tool timeout
and output bound, so the only thing gymflow adds on top of it is orchestration.
"""

from __future__ import annotations

import asyncio
import uuid

from activities.env import truncate
from activities.model import MODEL_ENDPOINT, ChatEndpoint, ModelConfig, chat_body
from envs import chat
from envs.contract import BaseEnv, Message, Task, ToolResult


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
        rollout_id = f"direct-{task.id}-{uuid.uuid4().hex[:6]}"
        await self.env.init_rollout(rollout_id, **task.init_args)
        try:
            tools = await self.env.list_tools()
            messages = [Message(role="system", content=await self.env.get_system_prompt(task))]
            messages += task.opening_messages()
            for turn in range(self.max_turns):
                body = chat_body(
                    model,
                    chat.render_messages(messages, tools, model.tool_format),
                    tools=chat.render_tools(tools, model.tool_format),
                )
                completion = await self.endpoint.complete(model.base_url, body, timeout_s=model.request_timeout_s)
                wire = completion["choices"][0]["message"]
                reply = chat.parse_assistant_message(wire, model.tool_format, id_prefix=f"call_{turn}")
                messages.append(reply)
                if not reply.tool_calls:
                    break
                for call in reply.tool_calls:
                    result = await self._tool(rollout_id, call.name, call.arguments)
                    text, _ = truncate(result.text, 16_000)
                    observation = Message(role="tool", content=text, tool_call_id=call.id, name=call.name)
                    messages.append(observation.model_copy(update={"is_error": result.is_error}))
            await self.env.compute_reward(rollout_id, messages, task.ground_truth, task_id=task.id)
        finally:
            await self.env.release_rollout(rollout_id)
        return messages

    async def _tool(self, rollout_id: str, name: str, arguments: dict[str, object]) -> ToolResult:
        try:
            raw = await asyncio.wait_for(self.env.run_tool(rollout_id, name, **arguments), self.tool_timeout_s)
        except TimeoutError:
            return ToolResult(text=f"error: tool {name!r} timed out", is_error=True)
        except Exception as exc:  # a tool's bug is the model's observation, as in the activity
            return ToolResult(text=f"error: {type(exc).__name__}: {exc}", is_error=True)
        return raw if isinstance(raw, ToolResult) else ToolResult(text=str(raw))
