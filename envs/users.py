"""Simulated users: envs whose episodes are conversations with a user who has a goal of their own.

A customer-facing agent is trained against a user it cannot see into (tau-bench): the user knows
what they want and facts the agent must ask for, and says them only when asked. An env declares
that user by mixing in `UserTurns` and naming a simulator; each task gives the user's private
instruction in `Task.init_args["user"]`, which never reaches the agent's conversation. The rollout
alternates: the agent answers (a final message, no tool call), the user replies, until the user
says it is done (`STOP` anywhere in its reply) or `max_user_turns` is spent. User turns are user
messages of the agent's conversation, so they are recorded with it, shown in the Web UI and
`gymflow inspect`, and masked out of the agent's loss like every message the model did not write.

The user is played by a script (`ScriptedUser`: tests, reference runs, offline evals) or by a model
behind any OpenAI-compatible endpoint (`ModelUser`). Each user reply is the rollout's
`env_response` activity, so it is retried, timed and recovered with the rollout like every other
turn. A user simulator that fails (an endpoint that errors, times out or answers with no text)
raises `InfraError`: the rollout ends infra-failed, never scored as the agent's 0.

This module is the user-simulator endpoint's boundary: `ModelUser` is its only HTTP client.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Protocol

import httpx

from gymflow.envs.contract import BaseEnv, Message
from gymflow.envs.errors import InfraError

STOP = "###STOP###"
"""Said by the user (anywhere in its reply) when the conversation is over for it."""
USER_PROMPT = """\
You are playing a user who is talking to a customer-support agent. Stay in character: write only \
what this user would say next, in one short message, in the first person. Reveal what you know \
only when the agent asks for it, and never invent facts beyond your instructions. When your goal \
has been met, or the agent cannot meet it, reply with {stop} and nothing else.

Your instructions:
{instruction}"""


class UserSimulator(Protocol):
    """Who plays the user: the next thing the user says, given its instruction and the agent's
    conversation so far (the agent's messages as the agent saw them)."""

    async def reply(self, instruction: str, conversation: Sequence[Message]) -> str: ...


class ScriptedUser:
    """A user played by code: `respond(instruction, conversation)` returns its next line (or STOP).

    `ScriptedUser.lines("a", "b")` says its lines in order, then STOP."""

    def __init__(self, respond: Callable[[str, Sequence[Message]], str | Awaitable[str]]) -> None:
        self._respond = respond

    @classmethod
    def lines(cls, *lines: str) -> ScriptedUser:
        def respond(instruction: str, conversation: Sequence[Message]) -> str:
            del instruction
            said = sum(1 for m in conversation if m.role == "user") - 1  # the opening is the task's
            return lines[said] if said < len(lines) else STOP

        return cls(respond)

    async def reply(self, instruction: str, conversation: Sequence[Message]) -> str:
        answer = self._respond(instruction, conversation)
        return await answer if isinstance(answer, Awaitable) else answer


class ModelUser:
    """A user played by a model behind an OpenAI-compatible chat endpoint.

    Args:
        base_url: `http://host:8000/v1`; None reads `GYMFLOW_USER_URL` when a reply is asked for.
        model: The model name sent.
        api_key_env: The environment variable holding the endpoint's API key (never in config).
        temperature: Sampling temperature of the user (a user is not greedy).
        attempts: Calls per reply at most; connection errors, 408/429/5xx and empty replies are
            tried again, then the reply fails with InfraError.
        timeout_s: Time limit of one call.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        model: str = "user",
        api_key_env: str = "GYMFLOW_USER_API_KEY",
        temperature: float = 0.7,
        attempts: int = 3,
        timeout_s: float = 60.0,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self.base_url = base_url
        self.model = model
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.attempts = attempts
        self.timeout_s = timeout_s

    async def reply(self, instruction: str, conversation: Sequence[Message]) -> str:
        """The user's next message.

        Raises:
            InfraError: No endpoint, a 4xx, or every attempt failed (the reason of the last one).
        """
        base_url = self.base_url or os.environ.get("GYMFLOW_USER_URL")
        if not base_url:
            raise InfraError("the user simulator has no endpoint: give ModelUser a base_url or set GYMFLOW_USER_URL")
        key = os.environ.get(self.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": self.model, "messages": user_view(instruction, conversation), "temperature": self.temperature}
        url = base_url.rstrip("/") + "/chat/completions"
        problem = ""
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=headers) as http:
            for attempt in range(self.attempts):
                if attempt:
                    await asyncio.sleep(min(4.0, 0.5 * 2**attempt))
                try:
                    response = await http.post(url, json=body)
                except httpx.HTTPError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                    continue
                if response.status_code in (408, 429) or response.status_code >= 500:
                    problem = f"HTTP {response.status_code}"
                    continue
                if response.status_code >= 400:
                    raise InfraError(f"the user simulator's endpoint refused the request: HTTP {response.status_code}")
                text = _reply_text(response)
                if text:
                    return text
                problem = "a reply with no text"
        raise InfraError(f"the user simulator failed {self.attempts} time(s); the last: {problem}")


def _reply_text(response: httpx.Response) -> str:
    try:
        content: Any = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    return content.strip() if isinstance(content, str) else ""


def user_view(instruction: str, conversation: Sequence[Message]) -> list[dict[str, str]]:
    """The conversation as the user model sees it: its instruction as the system message, its own
    lines (the agent's user messages, the task's opening first) as `assistant`, the agent's replies
    as `user`; system messages, tool calls and tool results are the agent's business and left out."""
    view = [{"role": "system", "content": USER_PROMPT.format(stop=STOP, instruction=instruction)}]
    for message in conversation:
        if message.role == "user":
            view.append({"role": "assistant", "content": message.content})
        elif message.role == "assistant" and message.content:
            view.append({"role": "user", "content": message.content})
    if view[-1]["role"] == "assistant":  # the user speaks in answer to the agent
        view.append({"role": "user", "content": "(the agent is waiting for your reply)"})
    return view


class UserTurns(BaseEnv):
    """Mix in before the env's base (`class Support(UserTurns, McpEnv)`): the env's final answers are
    answered by its `user` simulator, with each task's private `init_args["user"]` instruction.

    The instruction is kept per rollout on the worker that ran its init; a rollout moved to another
    worker (a lost node) gets it from its task again, so an env that is `stateless` (or `replayable`)
    keeps its user across a worker's death like every other turn."""

    env_turns = True
    user: ClassVar[UserSimulator | None] = None
    """Who plays the user; None: the env must override `user_simulator`."""
    max_user_turns: ClassVar[int] = 8
    """User replies per episode at most; then the episode ends (the reward decides what it got)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._instructions: dict[str, str] = {}

    def user_simulator(self) -> UserSimulator:
        """The simulator for the next reply (override to choose per env instance)."""
        if self.user is None:
            raise InfraError(f"{type(self).__name__} declares user turns but no user simulator (`user`)")
        return self.user

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        instruction = rollout_args.pop("user", None)
        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError("a task of an env with a simulated user needs init_args['user']: the user's instruction")
        self._instructions[rollout_id] = instruction
        await super().init_rollout(rollout_id, **rollout_args)

    async def release_rollout(self, rollout_id: str) -> None:
        self._instructions.pop(rollout_id, None)
        await super().release_rollout(rollout_id)

    async def env_response(self, rollout_id: str, messages: list[Message]) -> list[Message] | None:
        instruction = self._instructions.get(rollout_id)
        if instruction is None:
            raise InfraError(f"rollout {rollout_id!r} has no user here (its init ran on another worker?)")
        replies = sum(1 for m in messages if m.role == "user") - 1
        if replies >= self.max_user_turns:
            return None
        text = (await self.user_simulator().reply(instruction, messages)).strip()
        if not text:
            raise InfraError("the user simulator said nothing")
        if STOP in text:
            return None
        return [Message(role="user", content=text)]
