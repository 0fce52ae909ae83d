"""`gymflow eval rescore` and `gymflow eval ENV --resume` refused as a user meets it: the console script,
one `gymflow: ...` line naming what is wrong, exit 2, and the batch named left exactly as it was."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import pytest
from batch_support import FlakyMathEnv, MentalMathPolicy
from temporalio.client import Client, WorkflowExecutionStatus

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import BatchInput, BatchResult, RolloutOptions
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.group import BatchRolloutWorkflow

GYMFLOW = Path(sys.executable).parent / "gymflow"
REWARDS = Path(__file__).parents[1] / "workflows" / "rescore_rewards.py"

pytestmark = pytest.mark.skipif(not GYMFLOW.is_file(), reason=f"no console script at {GYMFLOW} (pip install -e .)")

CASES = {
    "rescore/unknown-batch": (("eval", "rescore", "no-such-batch", "--reward", "math"), "no batch 'no-such-batch'"),
    "rescore/live-env": (("eval", "rescore", "{batch}", "--reward", "crm"), "may read the rollout's live tools"),
    "rescore/live-file": (
        ("eval", "rescore", "{batch}", "--reward", f"{REWARDS}:reads_workspace"),
        "it takes workspace",
    ),
    "rescore/no-file": (("eval", "rescore", "{batch}", "--reward", "nope.py:fn"), "cannot load"),
    "rescore/bad-yaml": (("eval", "rescore", "{batch}", "--reward", "{fn: [}"), "not valid YAML"),
    "rescore/no-reward": (("eval", "rescore", "{batch}"), "gymflow eval rescore BATCH --reward SPEC"),
    "resume/other-env": (("eval", "math", "--resume", "{batch}"), f"is of env '{FlakyMathEnv.name}', not 'math'"),
    "resume/unknown-batch": (("eval", "math", "--resume", "no-such-batch"), "no batch 'no-such-batch'"),
    "resume/with-baseline": (("eval", "math", "--resume", "{batch}", "--baseline", "null"), "leave out --baseline"),
    "rescore/storage-gone": (
        ("eval", "rescore", "{batch}", "--reward", "math"),
        "stored trajectories are gone: no {part}",
    ),
}
DEFAULT = frozenset({"rescore/unknown-batch", "resume/other-env"})
"""One case of each kind runs by default; every case with `pytest -m slow` (each is a CLI process)."""


async def gymflow(*args: str, cwd: Path) -> tuple[int, str]:
    """The console script's exit code and stderr."""
    process = await asyncio.create_subprocess_exec(
        str(GYMFLOW), *args, cwd=cwd, env=dict(os.environ), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 110)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def finished_batch(client: Client, worker: RunningWorker) -> BatchResult:
    async with PolicyServer(MentalMathPolicy()) as policy:
        return await client.execute_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(
                env=FlakyMathEnv.name,
                dataset="generated",
                num_tasks=2,
                options=RolloutOptions(model=ModelConfig(base_url=policy.url)),
            ),
            id=f"cli-lineage-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )


def snapshot(batch: BatchResult) -> dict[str, bytes]:
    return {uri: Path(uri.removeprefix("file://")).read_bytes() for uri in batch.parts}


async def refuse(case: str, batch: BatchResult, *, address: str, tmp_path: Path) -> None:
    args, says = CASES[case]
    argv = [a.replace("{batch}", batch.batch_id) for a in args]
    says = says.replace("{part}", batch.parts[0])
    code, err = await gymflow(*argv, "--address", address, "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (case, err[-2000:])
    assert "Traceback" not in err and lines[-1].startswith("gymflow: "), (case, err[-2000:])
    assert says in lines[-1], (case, lines[-1])


@pytest.mark.parametrize(
    "cases",
    [
        pytest.param(sorted(DEFAULT), id="default"),
        pytest.param(sorted(set(CASES) - DEFAULT - {"rescore/storage-gone"}), id="all", marks=pytest.mark.slow),
    ],
)
@pytest.mark.heavy
async def test_refusals_are_one_line_and_lose_nothing(
    cases: list[str], client: Client, worker: RunningWorker, temporal_address: str, tmp_path: Path
) -> None:
    batch = await finished_batch(client, worker)
    before = snapshot(batch)
    for case in cases:
        await refuse(case, batch, address=temporal_address, tmp_path=tmp_path)
    assert snapshot(batch) == before
    assert (await client.get_workflow_handle(batch.batch_id).describe()).status == WorkflowExecutionStatus.COMPLETED
    assert not (tmp_path / "data" / "evals").exists()  # no report of anything
    # Last, its storage gone: refused too, naming the missing part; the batch itself stays as it was.
    Path(batch.parts[0].removeprefix("file://")).unlink()
    await refuse("rescore/storage-gone", batch, address=temporal_address, tmp_path=tmp_path)
    assert (await client.get_workflow_handle(batch.batch_id).describe()).status == WorkflowExecutionStatus.COMPLETED
