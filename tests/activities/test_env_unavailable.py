"""An env that cannot work on a node never scores: the CLI refuses it, a worker ends its rollouts infra-failed.

`BaseEnv.unavailable` is the env's own word (here: a binary this machine lacks). The CLI commands
that run rollouts on this node refuse to start, naming the fix, with exit status 2; a rollout
started anyway (SDK or `temporal workflow start`) on such a worker ends ``env_unavailable``,
infra-failed, reward None, with the node and the fix in its error, without the env ever being
built. The sheets env without a sandbox is tested alike in tests/envs/sheets/test_rollout.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, ClassVar

import pytest
from temporalio.client import Client

from gymflow.activities.names import ROLLOUT_WORKFLOW
from gymflow.activities.schema import RolloutResult
from gymflow.envs.contract import BaseEnv, Message, Reward, Task, TerminationReason, ToolSpec, Unavailable
from gymflow.envs.policy import NullPolicy
from gymflow.envs.registry import register
from gymflow.workers.worker import RunningWorker
from support import play, temporal_cli

FIX = "apt-get install frobnicator"


class FrobEnv(BaseEnv):
    """An env that needs a binary this machine lacks."""

    name = "needs-frob"
    built: ClassVar[int] = 0
    """How many instances were made (none should be, on a node that cannot run it)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        FrobEnv.built += 1

    @classmethod
    def unavailable(cls, **env_kwargs: Any) -> Unavailable | None:
        return Unavailable("the frobnicator binary is not installed", FIX)

    async def list_tools(self) -> list[ToolSpec]:
        return [ToolSpec(name="frob")]

    async def run_tool(self, rollout_id: str, tool_name: str, /, **tool_args: Any) -> str:
        return "frobbed"

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        return Reward.of(0.0)  # what a node without the binary must never hand back


register(FrobEnv.name, FrobEnv)
TASK = Task(id="frob-1", prompt="frob it")


def test_the_cli_refuses_it_naming_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    from gymflow.workers.cli.main import main

    expected = f"gymflow: {FrobEnv.name} cannot work on this node: the frobnicator binary is not installed. Fix: {FIX}"
    for argv in (["eval", FrobEnv.name, "--n", "2"], ["rollout", FrobEnv.name], ["demo", FrobEnv.name]):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == expected + "\n"


def _assert_unavailable(result: RolloutResult, node: str) -> None:
    assert result.termination == TerminationReason.ENV_UNAVAILABLE and result.infra_failed
    assert result.reward is None and result.turns == 0
    assert result.error is not None
    assert f"{FrobEnv.name} cannot work on node {node}" in result.error and FIX in result.error


async def test_a_rollout_started_with_the_sdk_ends_infra_failed(client: Client, worker: RunningWorker) -> None:
    built = FrobEnv.built
    result = await play(client, worker, NullPolicy(), env=FrobEnv.name, task=TASK)
    _assert_unavailable(result, worker.env.node_id)
    assert FrobEnv.built == built  # refused before the env was built


async def test_a_rollout_started_from_the_temporal_cli_ends_infra_failed(
    client: Client, worker: RunningWorker, temporal_address: str
) -> None:
    payload = {
        "env": FrobEnv.name,
        "task": TASK.model_dump(mode="json"),
        "model": {"base_url": "http://127.0.0.1:9/v1"},
    }
    workflow_id = f"frob-{uuid.uuid4().hex[:8]}"
    temporal_cli(
        temporal_address, "workflow", "start", "--type", ROLLOUT_WORKFLOW, "--task-queue", worker.task_queue,
        "--workflow-id", workflow_id, "--input", json.dumps(payload),
    )  # fmt: skip
    result = await client.get_workflow_handle(workflow_id, result_type=RolloutResult).result()
    _assert_unavailable(result, worker.env.node_id)
