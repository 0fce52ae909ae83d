"""`gymflow rollout --json --tokens vllm`: the JSON carries each rollout's token data."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gymflow.envs.contract import TerminationReason, Trajectory
from gymflow.envs.wire.tokens import TokenSequence, TurnTokens
from gymflow.workers.cli.runner import token_fields


@pytest.mark.heavy
def test_rollout_json_includes_token_data(temporal_address: str, tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "gymflow.workers.cli", "rollout", "math", "--n", "2", "--json", "--tokens", "vllm",
        "--address", temporal_address, "--task-queue", f"cli-{uuid.uuid4().hex[:8]}",
        "--data-dir", str(tmp_path / "data"),
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout)["rollouts"]
    assert len(rows) == 2
    for row in rows:
        turns = [TurnTokens.model_validate(t) for t in row["tokens"]]
        assert len(turns) == row["turns"] and isinstance(row["tokens"][0]["prompt_ids"], str)  # base64 on the wire
        sequence = TokenSequence.model_validate(row["token_sequence"])
        assert sum(sequence.loss_mask) == sum(len(t.completion_ids) for t in turns)


def test_a_rollout_of_roles_gets_one_sequence_per_role_in_its_json() -> None:
    turns = [
        TurnTokens(turn=0, prompt_ids=[1, 2], prompt_length=2, completion_ids=[3], speaker="solver"),
        TurnTokens(turn=1, prompt_ids=[1, 2, 9], prompt_length=3, completion_ids=[7], speaker="critic"),
    ]
    trajectory = Trajectory(rollout_id="r", task_id="t", env="e", termination=TerminationReason.FINAL_ANSWER,
                            messages=[], turns=2, tokens=turns, speakers=["solver", "critic"])  # fmt: skip
    fields = json.loads(json.dumps(token_fields(trajectory)))
    assert "token_sequence" not in fields and set(fields["role_sequences"]) == {"solver", "critic"}
    critic = TokenSequence.model_validate(fields["role_sequences"]["critic"])
    assert (critic.ids, critic.loss_mask) == ([1, 2, 9, 7], [0, 0, 0, 1])
    assert [t["speaker"] for t in fields["tokens"]] == ["solver", "critic"]
