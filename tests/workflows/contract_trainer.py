"""A minimal trainer speaking the contract (tests launch it as a run's local trainer).

It reads its spec and both splits, asks for one GRPO group played by the policy at
$CONTRACT_POLICY_URL, reports $CONTRACT_STEPS steps with a checkpoint (served by that same
endpoint) on the last one, and finishes, printing what the evaluations said.
"""

from __future__ import annotations

import asyncio
import os
import sys

from gymflow.activities.model import ModelConfig
from gymflow.activities.training_schema import CheckpointReport
from gymflow.workers.sdk.trainer import TrainerSession


async def main() -> int:
    session = await TrainerSession.connect()
    train, evals = await session.train_tasks(), await session.eval_tasks()
    print(f"started: {len(train)} train, {len(evals)} eval tasks", flush=True)
    policy = ModelConfig(base_url=os.environ["CONTRACT_POLICY_URL"])
    rewards = []
    async for group in session.groups(train[:1], n=2, model=policy):
        rewards += [r for r in group.rewards if r is not None]
    steps = int(os.environ.get("CONTRACT_STEPS", "1"))
    for step in range(1, steps + 1):
        checkpoint = None
        if step == steps:
            data = f"step {step}".encode()
            uri = await session.write_checkpoint(f"step-{step}.txt", data)
            checkpoint = CheckpointReport(name=f"step-{step}", step=step, uri=uri, endpoint=policy)
        await session.report(step, {"reward": sum(rewards) / len(rewards)}, checkpoint=checkpoint)
        if step == 1:  # a report retried after a lost connection is applied once
            await session.report(step, {"reward": -1.0})
    for summary in await session.finish():
        print(f"eval {summary.checkpoint}: {summary.mean} vs {summary.baseline_mean}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
