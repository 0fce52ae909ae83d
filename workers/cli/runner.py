"""Running a batch of rollouts from the command line (`gymflow rollout`, `gymflow demo`).

Brings up what is missing — the embedded Temporal server, a baseline policy endpoint, an
in-process worker — runs the rollouts as workflows, and reports. Everything started here is
real: the policy is served over HTTP, the worker polls Temporal like any other.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, TextIO

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput, RolloutLimits, RolloutResult
from gymflow.envs.contract import Task
from gymflow.envs.errors import TokenDataError
from gymflow.envs.registry import env_class
from gymflow.workers.config import Settings
from gymflow.workers.roles import COMMAND_ROLES
from gymflow.workers.sdk import client as sdk
from gymflow.workers.sdk import scripts
from gymflow.workers.sdk.local import connect_or_start, endpoint
from gymflow.workers.worker import running_worker


@dataclass
class BatchOptions:
    """What `gymflow rollout` / `gymflow demo` run."""

    env: str
    n: int = 16
    seed: int = 0
    dataset: str = "generated"
    model_url: str | None = None
    model: str = ""
    tool_format: str = "native"
    tokens: str = "off"
    """`ModelConfig.tokens`: record token ids and logprobs per turn (``vllm``/``sglang``)."""
    policy: str = "default"
    concurrency: int = 16
    max_turns: int = 10
    local_worker: bool = True
    start_server: bool = False
    batch_id: str = field(default_factory=lambda: f"batch-{uuid.uuid4().hex[:8]}")


@dataclass
class BatchReport:
    """Results of a batch, with the ids needed to find it in the Web UI."""

    batch_id: str
    results: list[RolloutResult]
    ui_url: str

    @property
    def rewards(self) -> list[float]:
        return [r.reward.total for r in self.results if r.reward is not None]

    def summary(self) -> dict[str, Any]:
        rewards = self.rewards
        return {
            "batch_id": self.batch_id,
            "rollouts": len(self.results),
            "completed": sum(not r.infra_failed for r in self.results),
            "infra_failed": sum(r.infra_failed for r in self.results),
            "mean_reward": statistics.fmean(rewards) if rewards else None,
            "ui": self.ui_url,
        }

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "workflow_id": r.rollout_id,
                "task_id": r.task_id,
                "reward": r.reward.total if r.reward else None,
                "termination": r.termination.value,
                "infra_failed": r.infra_failed,
                "turns": r.turns,
                "tool_calls": r.tool_calls,
                "error": r.error,
                **token_fields(r),
            }
            for r in self.results
        ]


def token_fields(result: RolloutResult) -> dict[str, Any]:
    """A rollout's token data for JSON output: per turn, and joined (or why it cannot be); a rollout of
    several roles gets one joined sequence per role (`role_sequences`) instead."""
    if not result.tokens:
        return {}
    key = "role_sequences" if result.speakers else "token_sequence"
    try:
        joined: dict[str, Any] = (
            {role: s.model_dump(mode="json") for role, s in result.role_sequences().items()}
            if result.speakers
            else result.token_sequence().model_dump(mode="json")
        )
    except TokenDataError as exc:
        joined = {"error": str(exc)}
    return {"tokens": [t.model_dump(mode="json") for t in result.tokens], key: joined}


def load_tasks(options: BatchOptions) -> list[Task]:
    """The tasks of the batch, from the env's dataset loader."""
    cls = env_class(options.env)
    tasks = list(cls.load_dataset(options.dataset, n=options.n, seed=options.seed))
    return tasks[: options.n]


async def run_batch(options: BatchOptions, settings: Settings, *, out: TextIO = sys.stderr) -> BatchReport:
    """Run the batch end to end and return its report; progress lines go to `out`."""
    tasks = load_tasks(options)
    client = await connect_or_start(settings, start_server=options.start_server, out=out)
    command = "demo" if options.start_server else "rollout"
    if options.local_worker:  # its own queue: no other command's rollouts, none of its own elsewhere
        settings = settings.command_queue(command)
        scripts.note_queue_on_interrupt(settings.task_queue)
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(endpoint(options.env, options.model_url or options.policy))
        if options.local_worker:
            await stack.enter_async_context(running_worker(client, settings, roles=COMMAND_ROLES[command]))
        inputs = [
            RolloutInput(
                env=options.env,
                task=task,
                model=ModelConfig(
                    base_url=url,
                    model=options.model,
                    tool_format=options.tool_format,
                    tokens=options.tokens,
                ),
                limits=RolloutLimits(max_turns=options.max_turns),
                batch_id=options.batch_id,
            )
            for task in tasks
        ]
        results: list[RolloutResult] = []
        async for result in sdk.run_rollouts(
            client, inputs, task_queue=settings.task_queue, concurrency=options.concurrency
        ):
            results.append(result)
            reward = f"{result.reward.total:.2f}" if result.reward else "infra-failed"
            print(f"[{len(results)}/{len(inputs)}] {result.task_id}: reward {reward} ({result.termination})", file=out)
    ui = f"{settings.ui_url}/workflows?query=GymflowBatch%3D%22{options.batch_id}%22"
    return BatchReport(options.batch_id, results, ui)


def format_table(report: BatchReport) -> str:
    """A plain-text table of the batch for humans."""
    rows = report.rows()
    header = f"{'task':<16} {'reward':>6} {'turns':>5} {'tools':>5}  {'termination':<14} workflow"
    lines = [header, "-" * len(header)]
    for row in sorted(rows, key=lambda r: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", r["task_id"])]):
        reward = "-" if row["reward"] is None else f"{row['reward']:.2f}"
        lines.append(
            f"{row['task_id']:<16} {reward:>6} {row['turns']:>5} {row['tool_calls']:>5}  "
            f"{row['termination']:<14} {row['workflow_id']}"
        )
    s = report.summary()
    lines.append("-" * len(header))
    mean = "-" if s["mean_reward"] is None else f"{s['mean_reward']:.3f}"
    lines.append(
        f"{s['rollouts']} rollouts, {s['completed']} completed, {s['infra_failed']} infra-failed, mean reward {mean}"
    )
    return "\n".join(lines)
