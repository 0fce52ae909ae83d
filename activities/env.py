"""The environment boundary: init_rollout / call_tool / compute_reward / release_rollout.

`init_rollout` runs on the shared queue; whichever worker takes it builds the rollout's state
(server processes, workspace) and answers with its own node queue, where every later activity
of the rollout is scheduled. Per-rollout state lives in the env instance under a state key
(`rollout_id#incarnation`), so a rollout re-initialised after losing its node never collides
with a stale copy of itself.

Failure mapping (the contract's rule, applied at the boundary):
* `ToolError` or any exception raised by a tool -> an error observation the model sees;
* `RolloutNotFound` -> non-retryable ROLLOUT_NOT_FOUND, `InfraError` -> non-retryable ENV_ERROR:
  retrying on the same dead state is useless, the workflow recovers on a fresh instance;
* bad env names/arguments -> non-retryable ENV_CONFIG; reward failures -> REWARD_ERROR;
* an env that cannot work on this node (`BaseEnv.unavailable`) -> ENV_UNAVAILABLE, raised by
  `init_rollout` before anything is built: retryable, since another node may have what this one
  lacks; when the attempts are spent the rollout ends infra-failed ``env_unavailable``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import structlog
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from gymflow.activities import errors
from gymflow.activities.context_cache import ContextCache
from gymflow.activities.env_schema import (
    CallToolInput,
    ComputeRewardInput,
    EnvResponse,
    EnvResponseInput,
    GroupRewardInput,
    InitRolloutInput,
    ReleaseInput,
    RolloutHandle,
)
from gymflow.activities.heartbeat import heartbeating, third_of_timeout
from gymflow.envs.contract import (
    BaseEnv,
    Message,
    Reward,
    ToolResult,
    Trajectory,
    json_bytes,
)
from gymflow.envs.errors import EnvFileError, InfraError, RewardError, RolloutNotFound, ToolError, UnknownEnvError
from gymflow.envs.harness.env import ProgramEnv
from gymflow.envs.registry import env_class, storage_name
from gymflow.envs.runtime.admission import Admission, Step

log = logging.getLogger(__name__)
T = TypeVar("T")


def state_key(rollout_id: str, incarnation: int) -> str:
    """Key of one incarnation of a rollout in an env instance."""
    return f"{rollout_id}#{incarnation}"


def fill_placeholders(text: str, values: Mapping[str, str]) -> str:
    """`text` with each `{name}` of `values` replaced; other braces (JSON, LaTeX) are left alone."""
    for name, value in values.items():
        text = text.replace(f"{{{name}}}", value)
    return text


def truncate(text: str, limit: int) -> tuple[str, int]:
    """Cut `text` to about `limit` chars keeping head and tail, with a visible marker."""
    if len(text) <= limit:
        return text, 0
    cut = len(text) - limit
    head = limit * 3 // 4
    tail = limit - head
    return f"{text[:head]}\n[... {cut} characters truncated ...]\n{text[len(text) - tail :]}", cut


class EnvActivities:
    """Env activities of one worker node; holds one instance per env name."""

    def __init__(
        self,
        *,
        node_id: str,
        node_queue: str,
        workspace_root: Path,
        env_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        common_env_kwargs: Mapping[str, Any] | None = None,
        payload_limit_bytes: int | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.node_id = node_id
        self.admission = admission or Admission()
        """The node's slots for expensive steps, shared by every env instance of this worker."""
        self.payload_limit_bytes = payload_limit_bytes
        self.node_queue = node_queue
        self.workspace_root = workspace_root
        self._env_kwargs = dict(env_kwargs or {})
        # Node-wide settings every env gets (e.g. the MCP warm pool size); BaseEnv accepts and
        # ignores what it does not use, and per-env kwargs override them.
        self._common_env_kwargs = {"admission": self.admission, **(common_env_kwargs or {})}
        self._envs: dict[str, BaseEnv] = {}
        self._held: dict[tuple[str, str], str] = {}
        """(env, state key) -> id of the workflow whose rollout holds that state on this node."""
        self.contexts = ContextCache()
        """Fused rollouts' conversations on this node, dropped with the rollout's state (gymflow.activities.turn)."""

    def env(self, name: str) -> BaseEnv:
        """The worker's instance of env `name`, created on first use."""
        env = self._envs.get(name)
        if env is None:
            env = self._class(name)(workspace_root=self.workspace_root / storage_name(name), **self._kwargs(name))
            self._envs[name] = env
        return env

    def check_available(self, name: str) -> None:
        """Raise ENV_UNAVAILABLE (naming the node and the fix) when env `name` cannot work here."""
        built = self._envs.get(name)
        problem = (type(built) if built is not None else self._class(name)).unavailable(**self._kwargs(name))
        if problem is not None:
            raise ApplicationError(f"{name} cannot work on node {self.node_id}: {problem}", type=errors.ENV_UNAVAILABLE)

    def _class(self, name: str) -> type[BaseEnv]:
        try:
            return env_class(name)
        except (UnknownEnvError, EnvFileError) as exc:
            raise errors.non_retryable(str(exc), type=errors.ENV_CONFIG) from exc

    def _kwargs(self, name: str) -> dict[str, Any]:
        return {**self._common_env_kwargs, **self._env_kwargs.get(name, {})}

    @activity.defn(name="init_rollout")
    async def init_rollout(self, input: InitRolloutInput) -> RolloutHandle:
        """Build the rollout's state on this node; answer with the node's queue."""
        log_context(input.env, rollout_id=input.rollout_id)
        self.check_available(input.env)
        env = self.env(input.env)
        key = state_key(input.rollout_id, input.incarnation)
        try:
            await _with_heartbeat(env.init_rollout(key, **input.task.init_args))
            tools = await env.list_tools()
            values = {"rollout_id": input.rollout_id, **env.placeholders(key)}
            system_prompt = fill_placeholders(await env.get_system_prompt(input.task), values)
            opening = input.task.opening_messages()
            filled = [m.model_copy(update={"content": fill_placeholders(m.content, values)}) for m in opening]
            rubric = env.rubric(input.task)
            harness = env.harness_info(key) if isinstance(env, ProgramEnv) else None
        except InfraError as exc:
            await env.release_rollout(key)
            raise ApplicationError(f"init of {input.env} failed: {exc}", type=errors.ENV_ERROR) from exc
        except (TypeError, ValueError, ToolError) as exc:
            await env.release_rollout(key)
            raise errors.non_retryable(f"invalid init_args for {input.env}: {exc}", type=errors.ENV_CONFIG) from exc
        self._held[(input.env, key)] = activity.info().workflow_id or input.rollout_id
        return RolloutHandle(
            state_key=key,
            node_id=self.node_id,
            node_queue=self.node_queue,
            tools=tools,
            system_prompt=system_prompt,
            replayable=env.replayable,
            stateless=env.stateless,
            fused_turns=env.fused_turns,
            rubric=rubric,
            payload_limit_bytes=self.payload_limit_bytes,
            opening_messages=filled if filled != opening else None,
            sandbox=env.isolation_record(),
            env_package=env.package,
            env_turns=env.env_turns,
            harness=harness,
            roles=list(env.roles),
            workspace=values.get("workspace"),
        )

    @activity.defn(name="call_tool")
    async def call_tool(self, input: CallToolInput) -> ToolResult:
        """Run one tool call; tool failures come back as error observations."""
        log_context(input.env, state_key=input.state_key)
        env = self.env(input.env)
        call = input.call
        try:
            # The tool's timeout runs from admission: a queued call is not a hung one.
            raw = await _with_heartbeat(
                self._admitted(
                    env,
                    "run",
                    lambda: asyncio.wait_for(
                        env.run_tool(input.state_key, call.name, **call.arguments), input.timeout_s
                    ),
                )
            )
            result = raw if isinstance(raw, ToolResult) else ToolResult(text=str(raw))
        except RolloutNotFound as exc:
            raise errors.non_retryable(str(exc), type=errors.ROLLOUT_NOT_FOUND) from exc
        except InfraError as exc:
            raise errors.non_retryable(str(exc), type=errors.ENV_ERROR) from exc
        except TimeoutError:
            result = ToolResult(text=f"error: tool {call.name!r} timed out after {input.timeout_s:g}s", is_error=True)
        except ToolError as exc:
            result = ToolResult(text=f"error: {exc}", is_error=True)
        except Exception as exc:  # the tool's own bug is the model's observation, by contract
            log.warning("tool raised", extra={"tool": call.name}, exc_info=True)
            result = ToolResult(text=f"error: {type(exc).__name__}: {exc}", is_error=True)
        return within_payload_limit(_bounded(result, input.max_output_chars), self.payload_limit_bytes)

    @activity.defn(name="compute_reward")
    async def compute_reward(self, input: ComputeRewardInput) -> Reward:
        """Score the finished rollout while its state is still alive (then free it if `input.release`)."""
        log_context(input.env, state_key=input.state_key)
        env = self.env(input.env)
        try:
            raw = await _with_heartbeat(
                self._admitted(
                    env,
                    "reward",
                    lambda: env.compute_reward(
                        input.state_key,
                        input.messages,
                        input.task.ground_truth,
                        task_id=input.task.id,
                        metadata=input.task.metadata,
                    ),
                )
            )
            reward = Reward.of(raw)
        except RolloutNotFound as exc:
            raise errors.non_retryable(str(exc), type=errors.ROLLOUT_NOT_FOUND) from exc
        except InfraError as exc:
            # A reward machinery that ran and could not score (a Harbor verifier that crashed or timed
            # out) ends the rollout reward_error; any other infra failure (the state is gone) is recovered.
            kind = errors.REWARD_ERROR if isinstance(exc, RewardError) else errors.ENV_ERROR
            raise errors.non_retryable(str(exc), type=kind) from exc
        except ApplicationError:
            raise  # typed by its own boundary (a judge endpoint, storage)
        except (ValidationError, ValueError, TypeError) as exc:
            raise errors.non_retryable(f"invalid reward from {input.env}: {exc}", type=errors.REWARD_ERROR) from exc
        if input.release:
            await self._release_after_reward(input.env, input.state_key)
        return reward

    @activity.defn(name="env_response")
    async def env_response(self, input: EnvResponseInput) -> EnvResponse:
        """The env's answer to a final answer: who speaks next (`BaseEnv.roles` envs), then its user
        messages (`BaseEnv.env_turns` envs); either may end the episode."""
        log_context(input.env, state_key=input.state_key)
        env = self.env(input.env)
        role: str | None = None
        try:
            if env.roles:
                role = await _with_heartbeat(env.next_role(input.state_key, input.messages))
                if role is None:
                    return EnvResponse(done=True)
                if role not in env.roles:  # the env's own bug: no retry mends it
                    raise errors.non_retryable(
                        f"{input.env}.next_role named role {role!r}, which it does not declare (roles: "
                        f"{', '.join(env.roles)})",
                        type=errors.ENV_CONFIG,
                    )
            reply = await _with_heartbeat(env.env_response(input.state_key, input.messages)) if env.env_turns else []
        except RolloutNotFound as exc:
            raise errors.non_retryable(str(exc), type=errors.ROLLOUT_NOT_FOUND) from exc
        except InfraError as exc:
            raise errors.non_retryable(str(exc), type=errors.ENV_ERROR) from exc
        if reply is None:
            return EnvResponse(done=True)
        if (env.env_turns and not reply) or any(m.role != "user" for m in reply):
            raise errors.non_retryable(
                f"{input.env}.env_response must answer user messages or None, got roles "
                f"{[m.role for m in reply] or 'none'}",
                type=errors.ENV_ERROR,
            )
        return EnvResponse(messages=[within_message_limit(m, self.payload_limit_bytes) for m in reply], next_role=role)

    async def _admitted(self, env: BaseEnv, step: Step, work: Callable[[], Awaitable[T]]) -> T:
        """`work()`, started once the node admits it when `env` is CPU-bound (at once otherwise)."""
        if not env.cpu_bound:
            return await work()
        async with self.admission.slot(step):
            return await work()

    async def _release_after_reward(self, name: str, key: str) -> None:
        # The reward is computed: a failing release must not lose it. Whatever a release leaves
        # behind is freed when the worker shuts down, or by the next worker's orphan reaper.
        try:
            await self.release(name, key)
        except Exception:
            log.warning("release after the reward failed", extra={"state_key": key}, exc_info=True)

    @activity.defn(name="compute_group_reward")
    async def compute_group_reward(self, input: GroupRewardInput) -> list[dict[str, float]]:
        """Score a group of finished rollouts jointly (runs on any node: needs no rollout state)."""
        log_context(input.env)
        env = self.env(input.env)
        truths = [t.ground_truth for t in input.tasks]
        completions = input.completions
        if completions is None:
            completions = await _with_heartbeat(_conversations(input.rollout_ids))
        rows = await _with_heartbeat(
            env.compute_group_reward(input.rollout_ids, completions, truths, tasks=input.tasks)
        )
        try:
            if len(rows) != len(input.rollout_ids):
                raise ValueError(f"returned {len(rows)} reward dicts for {len(input.rollout_ids)} rollouts")  # noqa: TRY301
            return [Reward.of(row).components if row else {} for row in rows]
        except (ValidationError, ValueError, TypeError) as exc:
            raise errors.non_retryable(
                f"invalid group reward from {input.env}: {exc}", type=errors.REWARD_ERROR
            ) from exc

    @activity.defn(name="release_rollout")
    async def release_rollout(self, input: ReleaseInput) -> None:
        """Free the rollout's state. Idempotent."""
        log_context(input.env, state_key=input.state_key)
        await self.release(input.env, input.state_key)

    async def release(self, name: str, key: str) -> None:
        """Free one rollout state of env `name` (idempotent); what the activity and the reaper call."""
        self._held.pop((name, key), None)
        self.contexts.forget(key)
        await self.env(name).release_rollout(key)

    def held(self) -> dict[tuple[str, str], str]:
        """(env, state key) -> workflow id, for every rollout state this node holds."""
        return dict(self._held)

    async def shutdown(self) -> None:
        """Release every rollout of every env (worker exit)."""
        self._held.clear()
        self.contexts.clear()
        await asyncio.gather(*(env.shutdown() for env in self._envs.values()), return_exceptions=True)
        self.admission.shutdown()


def log_context(env: str, **fields: str) -> None:
    """Name the env (and rollout state) on every log line of this activity attempt, the SDK's
    own included: each attempt runs in its own task, so the binding ends with it."""
    structlog.contextvars.bind_contextvars(env=env, **fields)


async def _conversations(workflow_ids: list[str]) -> list[list[Message]]:
    """The conversations of finished rollout workflows, read from their results."""
    client = activity.client()
    results = await asyncio.gather(
        *(client.get_workflow_handle(id, result_type=Trajectory).result() for id in workflow_ids)
    )
    return [result.messages for result in results]


async def _with_heartbeat(awaitable: Awaitable[T]) -> T:
    """Await while heartbeating, so a dead worker is noticed within the heartbeat timeout
    while a slow but live tool keeps its activity open."""
    return await heartbeating(awaitable, third_of_timeout(0.5, default_s=10.0))


def within_message_limit(message: Message, payload_limit: int | None) -> Message:
    """An env's user message cut, like a tool result, to a share of the payload limit (if any)."""
    if payload_limit is None:
        return message
    cut = within_payload_limit(ToolResult(text=message.content), payload_limit)
    return message if cut.text == message.content else message.model_copy(update={"content": cut.text})


def _bounded(result: ToolResult, limit: int) -> ToolResult:
    text, cut = truncate(result.text, limit)
    structured = result.structured
    if structured is not None and len(json.dumps(structured, default=str)) > limit:
        structured = None  # the text carries the (truncated) content already
        cut = cut or 1
    if not cut:
        return result
    return result.model_copy(
        update={"text": text, "structured": structured, "truncated_chars": result.truncated_chars + cut}
    )


TOOL_RESULT_SHARE = 4
"""Without external payload storage, one tool result may take at most 1/4 of the payload limit
(512 KiB of the default 2 MiB): the conversation that carries it must fit too, with later turns."""


def within_payload_limit(result: ToolResult, payload_limit: int | None) -> ToolResult:
    """`result`, cut to fit a share of the deployment's payload limit when it has one.

    With external payload storage (`payload_limit` None) a result of any size is stored by
    Temporal's ExternalStorage and the model reads it whole. Without, Temporal would refuse the
    activity's result (and the rollout would end as an `env_error` worded by the SDK): inline media
    and structured content are dropped first, then the text is cut (head and tail kept) with a note
    the model reads.
    """
    if payload_limit is None:
        return result
    budget = payload_limit // TOOL_RESULT_SHARE
    size = json_bytes(result)
    if size <= budget:
        return result
    media = [a.model_copy(update={"data": None}) if a.data else a for a in result.attachments]
    lighter = result.model_copy(update={"structured": None, "attachments": media})
    dropped = [
        *([f"{n} inline attachment(s)"] if (n := sum(a.data is not None for a in result.attachments)) else []),
        *(["its structured content"] if result.structured is not None else []),
    ]
    note = (
        f"[gymflow: this tool result was {size} bytes, over the {budget}-byte share of the payload limit "
        "one result may use here; " + (f"dropped {' and '.join(dropped)}; " if dropped else "") + "text cut to fit]"
    )
    keep = len(lighter.text)
    while True:
        text, cut = truncate(lighter.text, keep)
        fitted = lighter.model_copy(update={"text": f"{text}\n{note}", "truncated_chars": result.truncated_chars + cut})
        fitted_size = json_bytes(fitted)
        if fitted_size <= budget or keep == 0:
            return fitted
        keep = max(0, min(keep - 1, int(keep * budget / fitted_size * 0.95)))
