"""The program boundary of harness rollouts: `run_program` runs a rollout's agent program to its end.

It runs on the rollout's node queue, where the rollout's workspace is, for as long as the program
runs, heartbeating: a worker killed under it is noticed within the heartbeat timeout, and the
workflow then starts the program again on a fresh incarnation of the rollout
(gymflow.workflows.harness). Cancelling the activity (a cancelled rollout, a spent budget) kills the
program's process group.

Before the program starts, the node's gateway admits it: a fresh random token, routed to this
rollout's workflow run and program start, becomes its API key and is part of its base URLs; the
token is revoked when the program ends. The token is the gateway's, never an upstream key, and is
not returned: history never holds it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from temporalio import activity

from gymflow.activities import errors
from gymflow.activities.env import EnvActivities, log_context
from gymflow.activities.heartbeat import heartbeating, third_of_timeout
from gymflow.envs.contract import Wire
from gymflow.envs.errors import RolloutNotFound
from gymflow.envs.harness.env import ProgramEnv, gateway_variables
from gymflow.envs.harness.program import ProgramError


class RunProgramInput(Wire):
    """Input of `run_program`."""

    compact_json = True

    env: str
    state_key: str
    prompt: str
    """The task's prompt (the program's ``{prompt}`` and ``GYMFLOW_PROMPT``)."""
    start: int = 0
    """Which start of the program this is (0 first; the rollout's recoveries after that)."""


class RunProgramResult(Wire):
    """How the program ended."""

    exit_code: int | None
    output: str = ""
    """The end of its output."""
    duration_s: float = 0.0


@dataclass(frozen=True)
class Admission:
    """What a program needs to reach its rollout through the gateway."""

    token: str
    openai_base_url: str
    """``…/r/<token>/v1``"""
    anthropic_base_url: str
    """``…/r/<token>`` (the anthropic client appends ``/v1/messages``)."""


class GatewayAccess(Protocol):
    """The node's model gateway, as `run_program` uses it (gymflow.workers.servers.gateway.Gateway)."""

    def admit(self, *, workflow_id: str, run_id: str, start: int) -> Admission: ...

    def revoke(self, token: str) -> None: ...


class HarnessActivities:
    """`run_program`, on the node queue.

    Args:
        envs: The node's env activities (the env instances holding the rollouts' workspaces).
        gateway: The node's model gateway.
    """

    def __init__(self, envs: EnvActivities, gateway: GatewayAccess) -> None:
        self._envs = envs
        self._gateway = gateway

    @activity.defn(name="run_program")
    async def run_program(self, input: RunProgramInput) -> RunProgramResult:
        """Start the rollout's program and wait for it to exit, heartbeating.

        Raises:
            ApplicationError: ``ENV_CONFIG`` (non-retryable) when the env runs no program or the program
                cannot start; ``ROLLOUT_NOT_FOUND`` when this node holds no state for the rollout.
        """
        log_context(input.env, state_key=input.state_key)
        env = self._envs.env(input.env)
        if not isinstance(env, ProgramEnv):
            raise errors.non_retryable(f"{input.env} is not a harness env: it runs no program", type=errors.ENV_CONFIG)
        info = activity.info()
        admission = self._gateway.admit(
            workflow_id=info.workflow_id or "", run_id=info.workflow_run_id or "", start=input.start
        )
        try:
            variables = gateway_variables(
                openai_base_url=admission.openai_base_url,
                anthropic_base_url=admission.anthropic_base_url,
                api_key=admission.token,
            )
            values = {
                "openai_base_url": admission.openai_base_url,
                "anthropic_base_url": admission.anthropic_base_url,
                "api_key": admission.token,
            }
            try:
                program = await env.start_program(
                    input.state_key, prompt=input.prompt, gateway=variables, values=values
                )
            except RolloutNotFound as exc:
                raise errors.non_retryable(str(exc), type=errors.ROLLOUT_NOT_FOUND) from exc
            except ProgramError as exc:
                raise errors.non_retryable(str(exc), type=errors.ENV_CONFIG) from exc
            try:
                ended = await heartbeating(program.wait(), third_of_timeout(0.5, default_s=10.0))
            except asyncio.CancelledError:
                await asyncio.shield(env.stop_program(input.state_key))
                if activity.is_worker_shutdown():  # not the rollout's cancellation: it goes on elsewhere
                    raise errors.non_retryable(
                        f"the worker running the program (node {info.task_queue}) shut down", type=errors.ENV_ERROR
                    ) from None
                raise
        finally:
            self._gateway.revoke(admission.token)
        return RunProgramResult(exit_code=ended.exit_code, output=ended.output, duration_s=ended.duration_s)
