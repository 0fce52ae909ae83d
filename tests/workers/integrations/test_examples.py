"""The trainer-integration examples the docs show (docs/guides/trainers.md, sessions.md) run here."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.trainers.integrations.examples.session_episode import play_one_episode
from gymflow.workers.trainers.integrations.examples.skyrl_episode import skyrl_episode
from gymflow.workers.trainers.integrations.examples.stream_groups import train_on_groups
from gymflow.workers.worker import RunningWorker

ROOT = Path(__file__).parents[3]
EXAMPLES = sorted((ROOT / "workers" / "trainers" / "integrations" / "examples").glob("[!_]*.py"))


def test_the_examples_are_found() -> None:
    # trl_grpo runs in the trainer venv, through tests/workers/integrations/trl_steps.py (test_trl.py)
    assert [p.stem for p in EXAMPLES] == ["session_episode", "skyrl_episode", "stream_groups", "trl_grpo"]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_docs_include_the_example(path: Path) -> None:
    pages = "".join(page.read_text() for page in (ROOT / "docs" / "guides").glob("*.md"))
    assert f'--8<-- "{path.relative_to(ROOT)}"' in pages


@pytest.mark.slow  # the example's groups, end to end; the groups API is covered by tests/workers/test_groups.py
async def test_stream_groups_example(worker: RunningWorker, temporal_address: str) -> None:
    async with PolicyServer(CalculatorPolicy()) as server:
        used = await train_on_groups(temporal_address, server.url, task_queue=worker.task_queue)
    assert used == 4 * 8


async def test_session_example(worker: RunningWorker, temporal_address: str) -> None:
    assert await play_one_episode(temporal_address, task_queue=worker.task_queue) == 1.0


async def test_skyrl_example(worker: RunningWorker, temporal_address: str) -> None:
    assert await asyncio.to_thread(skyrl_episode, temporal_address, task_queue=worker.task_queue) == 1.0
