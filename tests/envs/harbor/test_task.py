"""Loading Harbor task directories: the test suite's tasks, and clear errors for bad ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gymflow.envs.builtin.harbor.task import load_dataset, load_task
from gymflow.envs.builtin.harbor.verifier import parse_reward
from gymflow.envs.errors import TaskError, VerifierError, VerifierFailure

TASKS = Path(__file__).parent / "tasks"


def test_the_suite_loads_as_a_dataset() -> None:
    tasks = load_dataset(TASKS)
    assert len(tasks) >= 10
    by_name = {t.name: t for t in tasks}
    assert by_name["agent-timeout"].config.agent.timeout_sec == 3
    assert by_name["verifier-env"].config.verifier.env == {"EXPECTED_ANSWER": "1764"}
    limits = by_name["edit-config"].limits()
    assert (limits.memory_mb, limits.storage_mb, limits.network) == (256, 256, False)
    assert all(t.instruction and t.solution_dir is not None for t in tasks)


def copy_task(tmp_path: Path) -> Path:
    task = tmp_path / "task"
    shutil.copytree(TASKS / "edit-config", task)
    return task


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[agent\ntimeout_sec = 1", "not valid TOML"),
        ("[agent]\ntimeout_sec = -1", "agent.timeout_sec"),
        ('[environment]\nmemory = "lots"', "not a size"),
        ("[environment]\ngpus = 1", "GPU tasks are not supported"),
        ('[environment]\ndocker_image = "x/y:1"', "prebuilt images are not supported"),
    ],
)
def test_bad_task_toml_names_file_and_field(tmp_path: Path, toml: str, message: str) -> None:
    task = copy_task(tmp_path)
    (task / "task.toml").write_text(toml)
    with pytest.raises(TaskError, match=message) as caught:
        load_task(task)
    assert "task.toml" in str(caught.value)


def test_harbor_size_strings_are_read(tmp_path: Path) -> None:
    task = copy_task(tmp_path)
    (task / "task.toml").write_text('[environment]\nmemory = "1G"\nstorage = "512M"\n')
    env = load_task(task).config.environment
    assert (env.memory_mb, env.storage_mb) == (1024, 512)


@pytest.mark.parametrize("missing", ["task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh"])
def test_missing_files_are_named(tmp_path: Path, missing: str) -> None:
    task = copy_task(tmp_path)
    (task / missing).unlink()
    with pytest.raises(TaskError, match="missing"):
        load_task(task)


def test_an_empty_directory_is_no_dataset(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no task directories"):
        load_dataset(tmp_path)


def test_reward_files_parse_or_fail_typed() -> None:
    assert parse_reward("reward.txt", "0.75\n") == (0.75, {"reward": 0.75}, {})
    reward, components, details = parse_reward("reward.json", '{"reward": 0.5, "tests": 2, "note": "x"}')
    assert (reward, components, details) == (0.5, {"reward": 0.5, "tests": 2.0}, {"note": "x"})
    for name, content in [("reward.txt", "great"), ("reward.txt", "nan"), ("reward.json", "{}"), ("reward.json", "[1")]:
        with pytest.raises(VerifierError) as caught:
            parse_reward(name, content)
        assert caught.value.reason is VerifierFailure.BAD_REWARD
