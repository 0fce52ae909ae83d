"""Rescoring a finished batch (`RescoreBatchWorkflow`, `gymflow.workers.sdk.rescore.rescore_batch`).

A 200-rollout batch is run once against a real policy endpoint that counts what it answers, then
rescored twice: with the env's own reward by name (the rewards must equal the ones the rollouts got
live) and with a reward file (the rewards must equal that function computed on each stored
completion). Neither reaches the endpoint; infra-failed rollouts stay infra-failed; the source
batch's parts stay byte for byte; the new batch has its own id, parts, report, search attributes,
final status and lineage. The refusals (unknown batch, storage gone, a reward that does not load or
needs the live rollout, an unfinished batch) lose nothing and say why.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import figures
import pytest
from batch_support import FlakyMathEnv, MentalMathPolicy, flaky
from mcp_support import activity_types
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from gymflow.activities import names
from gymflow.activities.model import ModelConfig
from gymflow.activities.rescore import RescoreInput
from gymflow.activities.schema import BatchInput, BatchResult, RolloutOptions
from gymflow.activities.storage import read_trajectories
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.errors import BatchError, LiveRewardError, RewardSpecError
from gymflow.envs.mcp.reward import final_text
from gymflow.envs.plugins import load_callable
from gymflow.workers.cli import exits
from gymflow.workers.config import Settings
from gymflow.workers.sdk.rescore import RescoreOptions, rescore_batch
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.group import BatchRolloutWorkflow
from gymflow.workflows.rescore import RescoreBatchWorkflow
from support import InProcessMathEnv, make_settings

REWARDS = Path(__file__).parent / "rescore_rewards.py"
brevity = load_callable(f"{REWARDS}:brevity")
TASKS, SAMPLES, SEED = 100, 2, 3


async def run_batch(client: Client, worker: RunningWorker, url: str, *, tasks: int, samples: int) -> BatchResult:
    return await client.execute_workflow(
        BatchRolloutWorkflow.run,
        BatchInput(
            env=FlakyMathEnv.name,
            dataset="generated",
            dataset_options={"n": tasks, "seed": SEED},
            num_tasks=tasks,
            samples_per_task=samples,
            options=RolloutOptions(model=ModelConfig(base_url=url)),
            window=64,
            flush_bytes=16_000,  # several parts, rescored a window at a time
            label="calculator",
        ),
        id=f"rescore-src-{uuid.uuid4().hex[:8]}",
        task_queue=worker.task_queue,
    )


def sdk_settings(worker: RunningWorker, address: str, tmp_path: Path) -> Settings:
    """Settings of an SDK call that relies on the test's worker (its queue) and dials the test server."""
    return make_settings(tmp_path, temporal_address=address, task_queue=worker.task_queue)


def part_bytes(parts: list[str]) -> dict[str, bytes]:
    return {uri: Path(uri.removeprefix("file://")).read_bytes() for uri in parts}


async def check_visible(client: Client, result: BatchResult, source_id: str) -> None:
    """The rescore is a batch of its own: attributes, final status, lineage in memo and report, no model turn."""
    handle = client.get_workflow_handle(result.batch_id)
    described = await handle.describe()
    assert described.workflow_type == names.RESCORE_WORKFLOW
    assert described.status == WorkflowExecutionStatus.COMPLETED
    attributes = described.typed_search_attributes
    assert attributes.get(names.SA_BATCH) == result.batch_id
    assert attributes.get(names.SA_ENV) == FlakyMathEnv.name
    assert attributes.get(names.SA_STATUS) == names.Status.COMPLETED.value
    assert (await described.memo())["rescored_from"] == source_id
    assert set(await activity_types(client, result.batch_id)) == {
        "prepare_rescore",
        "rescore_part",
        "render_batch_report",
    }
    assert result.report is not None
    page = Path(result.report.removeprefix("file://")).read_text()
    assert f"rescored from {source_id} with reward {result.reward}" in page


@pytest.mark.timeout(300)  # about 30 s on two shared cores; more when others load them
@pytest.mark.heavy
async def test_rescore_200_rollouts_without_a_model_call(
    client: Client, worker: RunningWorker, temporal_address: str, tmp_path: Path
) -> None:
    tasks = TASKS  # 200 rollouts
    async with PolicyServer(MentalMathPolicy(), record_requests=True) as policy:
        started = time.monotonic()
        source = await run_batch(client, worker, policy.url, tasks=tasks, samples=SAMPLES)
        batch_s = time.monotonic() - started
        answered = len(policy.requests)
        expected_infra = SAMPLES * sum(flaky(t.id) for t in generate_tasks(tasks, seed=SEED, difficulty=1))
        rollouts = tasks * SAMPLES
        assert source.total == rollouts and source.infra_failed == expected_infra > 0 and answered == rollouts
        assert len(source.parts) >= 2
        stored = part_bytes(source.parts)
        settings = sdk_settings(worker, temporal_address, tmp_path)
        started = time.monotonic()
        by_env = await rescore_batch(
            RescoreOptions(batch=source.batch_id, reward=InProcessMathEnv.name, out=tmp_path / "env", reps=200,
                           local_worker=False),
            settings,
        )  # fmt: skip
        env_s = time.monotonic() - started
        by_file = await rescore_batch(
            RescoreOptions(batch=source.batch_id, reward=f"{REWARDS}:brevity", out=tmp_path / "file", reps=200,
                           local_worker=False),
            settings,
        )  # fmt: skip
        assert len(policy.requests) == answered  # no request reached the model endpoint

    old = {t.rollout_id: t for t in await read_trajectories(source.parts)}
    truths = {t.id: t.ground_truth for t in generate_tasks(tasks, seed=SEED, difficulty=1)}
    for summary in (by_env, by_file):
        result = BatchResult.model_validate(summary["result"])
        assert result.batch_id != source.batch_id and result.rescored_from == source.batch_id
        assert (result.total, result.completed, result.infra_failed) == (
            rollouts,
            source.completed,
            source.infra_failed,
        )
        assert all(f"/{result.batch_id}/trajectories/part-" in uri for uri in result.parts)
        assert len(result.parts) == len(source.parts)
        new = {t.rollout_id: t for t in await read_trajectories(result.parts)}
        assert new.keys() == old.keys()
        for rollout_id, before in old.items():
            after = new[rollout_id]
            if before.infra_failed:  # stays infra-failed: never scored, never a 0
                assert after.infra_failed and after.reward is None and after.termination == before.termination
                continue
            assert after.messages == before.messages and after.reward is not None
            if summary is by_env:  # the env's reward, as the live rollout computed it
                assert before.reward is not None and after.reward.total == before.reward.total
                assert after.reward.components == before.reward.components
            else:  # the file's reward computed on the same completion
                expected = brevity(final_text(before.messages), truths[before.task_id])
                assert after.reward.components == expected
                assert after.reward.total == sum(expected.values())
        await check_visible(client, result, source.batch_id)
        assert summary["batches"][0]["lineage"].startswith(f"rescored from {source.batch_id}")
    assert by_file["reward"] == f"{REWARDS}:brevity" and by_env["reward"] == InProcessMathEnv.name
    assert by_file["policy"]["mean"]["value"] != by_env["policy"]["mean"]["value"]  # another reward indeed
    assert part_bytes(source.parts) == stored  # the source is only read
    figures.record(
        "rescore", f"{rollouts}-rollout batch rescored", batch_s=round(batch_s, 1), wall_s=round(env_s, 2),
        parts=len(source.parts), model_requests=0, infra_failed_kept=source.infra_failed,
    )  # fmt: skip


async def test_rescore_refusals_lose_nothing(
    client: Client, worker: RunningWorker, temporal_address: str, tmp_path: Path
) -> None:
    async with PolicyServer(MentalMathPolicy()) as policy:
        source = await run_batch(client, worker, policy.url, tasks=3, samples=1)
    stored = part_bytes(source.parts)
    settings = sdk_settings(worker, temporal_address, tmp_path)

    async def refused(batch: str, reward: str) -> Exception:
        with pytest.raises((BatchError, RewardSpecError)) as caught:
            await rescore_batch(RescoreOptions(batch=batch, reward=reward, out=tmp_path / "out", local_worker=False),
                                settings)  # fmt: skip
        return caught.value

    unknown = await refused("no-such-batch", InProcessMathEnv.name)
    assert isinstance(unknown, BatchError) and "no batch 'no-such-batch'" in str(unknown)
    missing = await refused(source.batch_id, "no_such_file.py:reward")
    assert type(missing) is RewardSpecError and "no_such_file.py" in str(missing)
    signature = await refused(source.batch_id, f"{REWARDS}:needs_more")
    assert type(signature) is RewardSpecError and "judge_url" in str(signature)
    for live in (f"{REWARDS}:reads_workspace", "counter", "crm"):  # a file's, an env's and a built-in env's
        error = await refused(source.batch_id, live)
        assert isinstance(error, LiveRewardError) and "live" in str(error), (live, error)
    unfinished = await client.start_workflow(  # nobody polls its queue: it never finishes
        BatchRolloutWorkflow.run,
        BatchInput(env=FlakyMathEnv.name, dataset="generated", num_tasks=1),
        id=f"rescore-open-{uuid.uuid4().hex[:8]}",
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
    )
    open_batch = await refused(unfinished.id, InProcessMathEnv.name)
    assert "has not completed (it is running)" in str(open_batch)
    await unfinished.terminate(reason="test done")
    not_a_batch = await refused(f"{source.batch_id}/r0", InProcessMathEnv.name)
    assert "is a RolloutWorkflow, not a batch" in str(not_a_batch)
    # Started directly (`temporal workflow start`), the workflow refuses the same way, before writing.
    with pytest.raises(WorkflowFailureError) as failed:
        await client.execute_workflow(
            RescoreBatchWorkflow.run,
            RescoreInput(source=source.batch_id, reward=f"{REWARDS}:reads_workspace"),
            id=f"rescore-direct-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(names.SA_ENV, FlakyMathEnv.name)]),
        )
    code, line = exits.workflow_failure(failed.value) or (0, "")
    assert code == exits.USER_ERROR and "reads the live rollout" in line and "\n" not in line
    assert part_bytes(source.parts) == stored and not (tmp_path / "out").exists()
    # The storage gone: refused, naming the part; the batch itself is left as it is.
    gone = source.parts[0]
    Path(gone.removeprefix("file://")).unlink()
    storage = await refused(source.batch_id, InProcessMathEnv.name)
    assert f"stored trajectories are gone: no {gone}" in str(storage)
    assert (await client.get_workflow_handle(source.batch_id).describe()).status == WorkflowExecutionStatus.COMPLETED
