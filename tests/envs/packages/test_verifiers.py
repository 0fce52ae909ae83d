"""verifiers (0.4) environments, unmodified, in verifiers' own venv (it pins mcp 2.0.0), through
`gymflow eval`: a single-turn taskset, a taskset whose tasks bring an MCP toolset, and a multi-turn
env whose `run()` answers each guess (gymflow's env turns). Rewards match verifiers' own scoring of
the same conversations (its turn-commit machinery, then the task's `score()`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from interop_support import gymflow_eval, record_of, require, run_reference, tool_calls
from temporalio.client import Client

from gymflow.envs.registry import env_class


@pytest.mark.parametrize(
    "case",
    [  # each bridge imports verifiers (seconds of CPU): the default suite keeps the multi-turn kind
        pytest.param(("vf-arith", "vf_arith", 2, 1.5), marks=pytest.mark.slow),  # correct (1) + brief (0.5 weight)
        pytest.param(("vf-calc", "vf_calc", 2, 1.25), marks=pytest.mark.slow),  # correct (1) + used_tool (0.25)
        ("vf-guess", "vf_guess", 2, None),  # found (1) + quick (0.1 weight, fewer turns better)
    ],
    ids=["single-turn", "tool", "multi-turn"],
)
async def test_verifiers_env_matches_its_own_scoring(
    client: Client, temporal_address: str, tmp_path: Path, case: tuple[str, str, int, float | None]
) -> None:
    require("vf")
    env, taskset, n, mean = case
    report, trajectories = await gymflow_eval(client, temporal_address, tmp_path, env, n=n)
    assert report["policy"]["completed"] == n and report["policy"]["infra_failed"] == 0
    if mean is not None:
        assert report["policy"]["mean"]["value"] == pytest.approx(mean)
    tasks = {t.id: t for t in env_class(env).load_dataset("generated")}
    for trajectory in trajectories:
        assert trajectory.env_package is not None and trajectory.env_package.kind == "verifiers"
        if env == "vf-calc":
            assert tool_calls(trajectory)[0][0] == "calc_add"  # named as verifiers' harnesses name it
        if env == "vf-guess":  # the env answered each wrong guess; the last reply is the secret
            said = [m.content for m in trajectory.messages if m.role == "user"][1:]
            assert said and set(said) <= {"higher", "lower"}
            assert trajectory.reward is not None and trajectory.reward.components["found"] == 1.0
    job = {
        "taskset": taskset,
        "trajectories": [
            {
                "vf_task": tasks[t.task_id].init_args["vf_task"],
                "messages": [m.model_dump(mode="json", exclude_defaults=True) for m in t.messages],
            }
            for t in trajectories
        ],
    }
    own = run_reference(record_of("vf"), "verifiers_score.py", job)
    for trajectory, theirs in zip(trajectories, own, strict=True):
        assert trajectory.reward is not None
        assert trajectory.reward.components == pytest.approx(theirs["rewards"])
        assert trajectory.reward.total == pytest.approx(theirs["total"])
