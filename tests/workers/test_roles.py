"""A worker serves the roles it is given (gymflow.workers.roles), each on queues of its own.

Checked by what the workers register (`RunningWorker.queues`, read from each SDK worker's config)
and by what a worker process imports, never by mocks: a rollout-only worker registers no dataset,
training or judge work, never imports their modules, and still runs rollouts; workers with
different roles on one deployment each run their own work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from temporalio.client import Client

from gymflow.activities import names
from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import DatasetInput, DatasetSource, RolloutInput
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.workers.cli.main import main
from gymflow.workers.config import ROLES, Settings
from gymflow.workers.processes import child_environment
from gymflow.workers.roles import BUILDERS, COMMAND_ROLES, all_workflows
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.worker import running_worker
from gymflow.workflows.dataset import DatasetGenerationWorkflow
from support import make_settings

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "envs" / "builtin" / "search" / "sample_corpus"
ROLLOUT_WORKFLOWS = {
    "RolloutWorkflow",
    "GroupRolloutWorkflow",
    "BatchRolloutWorkflow",
    "RolloutSessionWorkflow",
    "RescoreBatchWorkflow",
}
OTHER_ROLES_MODULES = (
    "gymflow.activities.dataset",
    "gymflow.activities.training",
    "gymflow.activities.trainer_jobs",
    "gymflow.activities.bundle",
    "gymflow.workflows.dataset",
    "gymflow.workflows.training",
    "gymflow.activities.trainer_backends",
)
"""The dataset and training roles' machinery: a worker without those roles never imports it."""


def math_rollout(policy_url: str, seed: int) -> RolloutInput:
    task = generate_tasks(1, seed=seed, difficulty=(1, 2))[0]
    return RolloutInput(env="math", task=task, model=ModelConfig(base_url=policy_url))


def test_every_role_has_a_builder_and_every_command_names_known_roles() -> None:
    assert set(BUILDERS) == set(ROLES)
    assert all(set(roles) <= set(ROLES) for roles in COMMAND_ROLES.values())
    assert {cls.__name__ for cls in all_workflows()} == ROLLOUT_WORKFLOWS | {
        "DatasetGenerationWorkflow",
        "TrainingRunWorkflow",
    }


async def test_a_rollout_only_worker_registers_only_rollout_work_and_runs_a_rollout(
    client: Client, tmp_path: Path, calculator_policy_url: str
) -> None:
    settings = make_settings(tmp_path)
    async with running_worker(client, settings, roles=["rollout"]) as worker:
        node = names.node_queue(settings.task_queue, settings.node_id)
        assert worker.roles == ("rollout",) and [part.role for part in worker.served] == ["rollout"]
        assert set(worker.queues) == {settings.task_queue, node}
        shared, on_node = worker.queues[settings.task_queue], worker.queues[node]
        assert shared.workflows == ROLLOUT_WORKFLOWS and not on_node.workflows
        assert shared.activities == {
            "ModelActivities.generate",
            "GatewayActivities.model_call",
            "EnvActivities.init_rollout",
            "EnvActivities.compute_group_reward",
            "StorageActivities.write_jsonl",
            "StorageActivities.load_tasks",
            "ReportActivities.render_batch_report",
            "RescoreActivities.prepare_rescore",
            "RescoreActivities.rescore_part",
            "ResumeActivities.carry_over",
        }
        assert on_node.activities == {
            "EnvActivities.init_rollout",  # a rollout pinned to this node (an agentic judge)
            "EnvActivities.call_tool",
            "EnvActivities.compute_reward",
            "EnvActivities.release_rollout",
            "EnvActivities.env_response",
            "TurnActivities.play_turn",
            "HarnessActivities.run_program",
        }
        assert worker.gateway.port > 0  # the rollout role's model gateway serves while the worker runs
        result = await run_rollout(client, math_rollout(calculator_policy_url, seed=5), task_queue=worker.task_queue)
    assert not result.infra_failed and result.reward is not None and result.reward.total == 1.0, result


@pytest.mark.heavy
def test_a_rollout_only_worker_process_never_imports_the_other_roles(temporal_address: str, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        from gymflow.workers.config import Settings
        from gymflow.workers.client import connect
        from gymflow.workers.worker import running_worker

        async def main():
            settings = Settings(temporal_address={temporal_address!r}, task_queue="roles-probe",
                                workspace_root={str(tmp_path / "ws")!r}, data_dir={str(tmp_path / "data")!r},
                                mcp_pool_size=0, worker_roles="rollout")
            client = await connect(settings.temporal_address)
            async with running_worker(client, settings) as worker:
                print(json.dumps({{"queues": sorted(worker.queues), "modules": sorted(sys.modules)}}), flush=True)

        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(found["queues"]) == 2  # the shared queue and the node queue
    assert "gymflow.activities.env" in found["modules"]  # the rollout role's machinery is there
    assert not [m for m in OTHER_ROLES_MODULES if m in found["modules"]]


async def test_workers_with_different_roles_share_a_deployment(
    client: Client, tmp_path: Path, calculator_policy_url: str
) -> None:
    rollouts = make_settings(tmp_path / "a")
    others = make_settings(tmp_path / "b", task_queue=rollouts.task_queue)  # one deployment, two nodes
    async with (
        running_worker(client, rollouts, roles=["rollout"]) as a,
        running_worker(client, others, roles=["dataset", "training", "judge"]) as b,
    ):
        # Temporal wants every worker of a queue to register the same work: these share no queue.
        assert not set(a.queues) & set(b.queues)
        assert set(b.queues) == {
            names.dataset_queue(rollouts.task_queue),
            names.training_queue(rollouts.task_queue),
            names.judge_queue(rollouts.task_queue),
        }
        assert b.queues[names.training_queue(rollouts.task_queue)].workflows == {"TrainingRunWorkflow"}
        with pytest.raises(LookupError, match="serves no rollout role"):
            _ = b.env
        input = DatasetInput(source=DatasetSource(kind="corpus", location=str(SAMPLE)), n=4, out=str(tmp_path / "ds"))
        dataset = await client.execute_workflow(
            DatasetGenerationWorkflow.run,
            input,
            id=f"roles-ds-{rollouts.node_id}",
            task_queue=names.dataset_queue(rollouts.task_queue),
        )
        rollout = await run_rollout(client, math_rollout(calculator_policy_url, seed=6), task_queue=a.task_queue)
    assert dataset.accepted == 4 and dataset.target_met
    assert not rollout.infra_failed and rollout.reward is not None and rollout.reward.total == 1.0


def test_roles_are_a_setting_an_option_and_a_fleet_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GYMFLOW_WORKER_ROLES", "training, rollout,training")
    settings = Settings()
    assert settings.worker_roles == ("training", "rollout")
    child = child_environment(settings, node_id="n-p0", count=2)
    assert child["GYMFLOW_WORKER_ROLES"] == "training,rollout"  # a supervisor's children serve its roles
    monkeypatch.delenv("GYMFLOW_WORKER_ROLES")
    assert Settings().worker_roles == ROLES
    monkeypatch.setitem(sys.modules, "sky", None)
    assert main(["deploy", "workers", "--nodes", "2", "--dryrun", "--roles", "rollout,judge"]) == 0
    task = yaml.safe_load(capsys.readouterr().out)
    assert task["envs"]["GYMFLOW_WORKER_ROLES"] == "rollout,judge"
    assert main(["worker", "--roles", "rollout,bogus"]) == 2
    err = capsys.readouterr().err
    assert "GYMFLOW_WORKER_ROLES" in err and "'rollout', 'judge', 'dataset' or 'training'" in err
    monkeypatch.setenv("GYMFLOW_WORKER_ROLES", "")
    assert main(["worker"]) == 2
    assert "name at least one role" in capsys.readouterr().err
