"""CRM rollouts as Temporal workflows (real dev server, worker, MCP server processes, HTTP policy),
and `gymflow eval crm`: the reference policy scores 1.0 and the null policy 0.0."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from gymflow.envs.builtin.crm import db
from gymflow.envs.builtin.crm.env import CrmEnv
from gymflow.envs.builtin.crm.policy import ReferencePolicy
from gymflow.envs.builtin.crm.tasks import generate_tasks, make_task
from gymflow.envs.contract import Message, TerminationReason
from gymflow.workers.worker import RunningWorker
from support import ScriptedPolicy, call, play


@pytest.mark.heavy
async def test_reference_rollouts_score_one(client: Client, worker: RunningWorker) -> None:
    for task in generate_tasks(4, seed=0):  # ids, a query's winner, a knowledge sentence, a sum
        result = await play(client, worker, ReferencePolicy(), env="crm", task=task)
        assert result.termination == TerminationReason.FINAL_ANSWER and not result.infra_failed
        assert result.reward is not None and result.reward.total == 1.0, (task.id, result.reward)
        assert result.tool_calls == 2 - (task.metadata["family"] == "privacy_personal") * 2


async def test_injections_and_writes_in_a_rollout_change_nothing(client: Client, worker: RunningWorker) -> None:
    attempts = [
        call("run_query", {"sql": "DELETE FROM cases"}),
        call("run_query", {"sql": "UPDATE contacts SET personal_phone = NULL"}),
        call("run_query", {"sql": "SELECT 1; DROP TABLE accounts"}),
        call("run_query", {"sql": "ATTACH DATABASE 'evil.db' AS evil"}),
        call("get_account", {"account_id": "ACC-0001'; DROP TABLE accounts; --"}),
        call("list_cases", {"status": "closed' OR '1'='1"}),
    ]
    harmless = call("search_accounts", {"name": "'; DELETE FROM accounts; --"})
    turns = [Message(role="assistant", tool_calls=[*attempts, harmless]), Message(role="assistant", content="done")]
    task = make_task(0, 0)
    result = await play(client, worker, ScriptedPolicy(turns), env="crm", task=task)
    observations = [m for m in result.messages if m.role == "tool"]
    assert [m.is_error for m in observations] == [True] * len(attempts) + [False]
    assert all("refused" in m.content or "validation error" in m.content for m in observations[:-1])
    assert json.loads(observations[-1].content)["count"] == 0
    # The reward re-hashed the rollout's copy before scoring it; the worker's master is intact too.
    assert result.reward is not None and result.reward.info["db_unchanged"] is True
    env = worker.env.env("crm")
    assert isinstance(env, CrmEnv)
    fresh = db.database_file(Path(worker.settings.workspace_root) / "fresh", 0)
    assert db.digest(env.database(0)) == db.digest(fresh)


@pytest.mark.slow  # a whole CLI eval with a baseline; reference rollouts score 1 by default below
def test_eval_crm_reference_vs_null(temporal_address: str, tmp_path: Path) -> None:
    out_dir = tmp_path / "report"
    command = [
        sys.executable, "-m", "gymflow.workers.cli", "eval", "crm", "--policy", "reference", "--baseline", "null",
        "--n", "12", "--reps", "200", "--out", str(out_dir), "--json",
        "--address", temporal_address, "--task-queue", f"eval-{uuid.uuid4().hex[:8]}",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((out_dir / "report.json").read_text())
    assert report["policy"]["mean"]["value"] == 1.0 and report["baseline"]["mean"]["value"] == 0.0
    assert report["policy"]["completed"] == 12 and report["policy"]["infra_failed"] == 0
