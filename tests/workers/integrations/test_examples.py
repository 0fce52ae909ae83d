"""The README's trainer-integration snippets are these files, verbatim, and they run here."""

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
EXAMPLES = sorted((ROOT / "workers" / "integrations" / "examples").glob("[!_]*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_readme_shows_the_example_verbatim(path: Path) -> None:
    assert f"```python\n{path.read_text()}```" in (ROOT / "README.md").read_text()


async def test_stream_groups_example(worker: RunningWorker, temporal_address: str) -> None:
    async with PolicyServer(CalculatorPolicy()) as server:
        used = await train_on_groups(temporal_address, server.url, task_queue=worker.task_queue)
    assert used == 4 * 8


async def test_session_example(worker: RunningWorker, temporal_address: str) -> None:
    assert await play_one_episode(temporal_address, task_queue=worker.task_queue) == 1.0


async def test_skyrl_example(worker: RunningWorker, temporal_address: str) -> None:
    assert await asyncio.to_thread(skyrl_episode, temporal_address, task_queue=worker.task_queue) == 1.0
