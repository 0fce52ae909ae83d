"""Local and S3 stores behind one interface; S3 is moto's server mode, a real HTTP S3 API."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from gymflow.activities.storage import (
    LoadTasksInput,
    LocalStore,
    StorageActivities,
    WriteJsonlInput,
    open_store,
    read_trajectories,
    to_jsonl,
    trajectories_from_jsonl,
)
from gymflow.envs.contract import Message, Reward, TerminationReason, Trajectory
from gymflow.envs.errors import StorageError


def trajectory(i: int) -> Trajectory:
    return Trajectory(
        rollout_id=f"r{i}",
        task_id=f"t{i}",
        env="math",
        messages=[
            Message(role="user", content=f"question {i}"),
            Message(role="assistant", content="<answer>1</answer>"),
        ],
        reward=Reward(total=1.0, components={"correct": 1.0}),
        termination=TerminationReason.FINAL_ANSWER,
    )


async def test_local_write_and_read_back(tmp_path: Path) -> None:
    activities = StorageActivities(default_uri=(tmp_path / "results").as_uri())
    items = [trajectory(i) for i in range(3)]
    uri = await ActivityEnvironment().run(
        activities.write_jsonl, WriteJsonlInput(key="b1/part-0.jsonl", trajectories=items)
    )
    assert uri.startswith("file://") and uri.endswith("b1/part-0.jsonl")
    assert await read_trajectories([uri]) == items


async def test_s3_write_and_read_back(s3_endpoint: str, aws: None) -> None:
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="gymflow-results")
    activities = StorageActivities(default_uri="s3://gymflow-results/evals", s3_endpoint_url=s3_endpoint)
    items = [trajectory(i) for i in range(5)]
    uri = await ActivityEnvironment().run(
        activities.write_jsonl, WriteJsonlInput(key="b2/part-0.jsonl", trajectories=items)
    )
    assert uri == "s3://gymflow-results/evals/b2/part-0.jsonl"
    assert await read_trajectories([uri], s3_endpoint_url=s3_endpoint) == items


async def test_s3_missing_bucket_is_a_retryable_storage_error(s3_endpoint: str, aws: None) -> None:
    activities = StorageActivities(default_uri="s3://no-such-bucket", s3_endpoint_url=s3_endpoint)
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(activities.write_jsonl, WriteJsonlInput(key="k.jsonl", trajectories=[]))
    assert info.value.type == "StorageError" and not info.value.non_retryable


@pytest.mark.parametrize("key", ["../escape.jsonl", "/abs.jsonl", "a//b.jsonl", "a/./b", ""])
async def test_bad_keys_are_refused(tmp_path: Path, key: str) -> None:
    activities = StorageActivities(default_uri=tmp_path.as_uri())
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(activities.write_jsonl, WriteJsonlInput(key=key, trajectories=[]))
    assert info.value.non_retryable
    assert not any(tmp_path.parent.glob("escape.jsonl"))


def test_unsupported_uri() -> None:
    with pytest.raises(StorageError, match="unsupported"):
        open_store("ftp://host/dir")
    with pytest.raises(StorageError, match="no bucket"):
        open_store("s3:///prefix")


async def test_local_store_refuses_reads_outside_its_root(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("x")
    store = LocalStore(tmp_path / "results")
    with pytest.raises(StorageError, match="outside"):
        await store.get((tmp_path / "results" / ".." / "secret.txt").as_uri())


def test_bad_jsonl_names_the_line() -> None:
    data = to_jsonl([trajectory(0)]) + b'{"not": "a trajectory"}\n'
    with pytest.raises(StorageError, match=r"part\.jsonl:2"):
        trajectories_from_jsonl(data, source="part.jsonl")


async def test_load_tasks_pages_a_dataset(tmp_path: Path) -> None:
    activities = StorageActivities(default_uri=tmp_path.as_uri())
    env = ActivityEnvironment()
    first = await env.run(
        activities.load_tasks, LoadTasksInput(env="math", dataset="generated", options={"n": 5}, limit=3)
    )
    rest = await env.run(
        activities.load_tasks, LoadTasksInput(env="math", dataset="generated", options={"n": 5}, offset=3, limit=3)
    )
    assert [t.id for t in first + rest] == [f"math-0-{i}" for i in range(5)]
    with pytest.raises(ApplicationError) as info:
        await env.run(activities.load_tasks, LoadTasksInput(env="math", dataset=str(tmp_path / "none.jsonl")))
    assert info.value.type == "EnvConfigError" and info.value.non_retryable
