"""Running a Harbor task: its container, its oracle, and its verifier, whose reward file is the reward.

After the agent is done (its final answer, or `[agent] timeout_sec`), the task's tests are copied
to `/tests` (never earlier: the agent must not read them) and `bash /tests/test.sh` runs in the same
container within `[verifier] timeout_sec`. It writes `/logs/verifier/reward.txt` (one number) or
`/logs/verifier/reward.json` (`{"reward": x, ...}`: the other numeric keys are kept as components,
anything else as details). `/logs` is the rollout's workspace, and `/logs/verifier` is emptied first,
so a reward file the agent planted is never read.

A verifier that times out, exits non-zero without a reward, writes none, or writes one that is not
a finite number raises `VerifierError` (an `InfraError` whose `termination` is
`TerminationReason.REWARD_ERROR`): the rollout is infra-failed, never scored 0. A verifier that
exits non-zero *with* a reward file is scored: test scripts commonly exit with pytest's status
after writing the reward.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from gymflow.envs.builtin.harbor.task import SOLUTION_SCRIPT, TEST_SCRIPT, HarborTask
from gymflow.envs.contract import Wire
from gymflow.envs.errors import VerifierError, VerifierFailure
from gymflow.envs.runtime.base import RolloutSpec, Sandbox
from gymflow.envs.runtime.container import ContainerRuntime
from gymflow.envs.runtime.images import build_image

LOGS_DIR = "/logs"
"""Where the rollout's workspace is mounted in a task container."""
VERIFIER_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
SOLUTION_DIR = "/solution"
DEFAULT_WORKDIR = "/app"
VERIFIER_OUTPUT_BYTES = 32 * 1024


class VerifierResult(Wire):
    """A verifier's verdict."""

    reward: float
    components: dict[str, float] = Field(default_factory=dict)
    """reward.json's numeric keys (the `reward` one included)."""
    details: dict[str, Any] = Field(default_factory=dict)
    """reward.json's other keys."""
    exit_code: int
    output: str = ""
    """The end of test.sh's output."""
    duration_s: float = 0.0


async def start_task(runtime: ContainerRuntime, task: HarborTask, *, rollout_id: str, workspace: Path) -> Sandbox:
    """Build the task's image (once per node) and start its container with the task's limits.

    Raises:
        BuildError: The image cannot be built.
        SandboxError: The container cannot start.
    """
    image = await build_image(
        runtime.engine,
        name=task.name,
        context=task.environment_dir,
        dockerfile=task.dockerfile,
        timeout_s=task.config.environment.build_timeout_sec,
        state_dir=runtime.state_root,  # host-wide: sibling worker processes build an image once
    )
    config = await runtime.engine.image_config(image)
    main = task.services.main_service if task.services is not None else None
    spec = RolloutSpec(
        rollout_id=rollout_id,
        node_id=runtime.node_id,
        workspace=str(workspace),
        limits=task.limits(),
        image=image,
        workdir=(main and main.working_dir) or str(config.get("WorkingDir") or "") or DEFAULT_WORKDIR,
        env=dict(main.environment) if main is not None else {},
        workspace_mount=LOGS_DIR,
        services=task.services,
    )
    return await runtime.start(spec)


async def install_solution(sandbox: Sandbox, task: HarborTask) -> str:
    """Copy the oracle into the container; returns the command that runs it (for the terminal tool)."""
    if task.solution_dir is None:
        raise ValueError(f"task {task.name!r} has no solution/{SOLUTION_SCRIPT}")
    await sandbox.copy_in(task.solution_dir, SOLUTION_DIR)
    return f"bash {SOLUTION_DIR}/{SOLUTION_SCRIPT}"


async def run_verifier(sandbox: Sandbox, task: HarborTask) -> VerifierResult:
    """Copy the tests in, run test.sh, read the reward file.

    Raises:
        VerifierError: Timeout, crash, or no valid reward file (the rollout is infra-failed).
        SandboxError: The container is gone (also infra).
    """
    reset = f"rm -rf {TESTS_DIR} {VERIFIER_DIR} && mkdir -p {VERIFIER_DIR} {TESTS_DIR}"
    prepared = await sandbox.exec(["sh", "-c", reset], timeout_s=60)
    if not prepared.ok:
        raise VerifierError(VerifierFailure.CRASHED, f"cannot prepare the verifier: {prepared.stderr.strip()}")
    await sandbox.copy_in(task.tests_dir, TESTS_DIR)
    started = time.monotonic()
    verifier = task.config.verifier
    result = await sandbox.exec(
        ["bash", f"{TESTS_DIR}/{TEST_SCRIPT}"],
        timeout_s=verifier.timeout_sec,
        env=verifier.env,
        max_output_bytes=VERIFIER_OUTPUT_BYTES,
    )
    output = (result.stdout + result.stderr)[-4000:]
    if result.timed_out:
        raise VerifierError(VerifierFailure.TIMEOUT, f"test.sh ran past {verifier.timeout_sec:g}s", output=output)
    read = f"cd {VERIFIER_DIR} && for f in reward.json reward.txt; do [ -f $f ] && {{ echo $f; cat $f; exit 0; }}; done"
    read += "; exit 3"
    found = await sandbox.exec(["sh", "-c", read], timeout_s=60)
    if found.exit_code == 3:
        if result.exit_code != 0:
            raise VerifierError(
                VerifierFailure.CRASHED, f"test.sh exited {result.exit_code} without a reward file", output=output
            )
        raise VerifierError(
            VerifierFailure.NO_REWARD, "test.sh wrote no /logs/verifier/reward.txt or reward.json", output=output
        )
    if not found.ok:
        raise VerifierError(
            VerifierFailure.CRASHED, f"cannot read the reward file: {found.stderr.strip()}", output=output
        )
    name, _, content = found.stdout.partition("\n")
    reward, components, details = parse_reward(name, content)
    assert result.exit_code is not None
    return VerifierResult(
        reward=reward,
        components=components,
        details=details,
        exit_code=result.exit_code,
        output=output,
        duration_s=time.monotonic() - started,
    )


def parse_reward(name: str, content: str) -> tuple[float, dict[str, float], dict[str, Any]]:
    """The reward, components and details of reward.txt / reward.json content.

    Raises:
        VerifierError: BAD_REWARD, naming the file and what is wrong.
    """
    if name == "reward.txt":
        value = _finite(content.strip(), name)
        return value, {"reward": value}, {}
    try:
        data = json.loads(content)
    except json.JSONDecodeError as exc:
        raise VerifierError(VerifierFailure.BAD_REWARD, f"reward.json is not JSON: {exc}") from None
    if not isinstance(data, dict) or "reward" not in data:
        raise VerifierError(VerifierFailure.BAD_REWARD, 'reward.json must be an object with a "reward" key')
    reward = _finite(data["reward"], "reward.json's reward")
    components = {
        k: float(v)
        for k, v in data.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    details = {k: v for k, v in data.items() if k not in components}
    return reward, components, details


def _finite(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise VerifierError(VerifierFailure.BAD_REWARD, f"{what} is not a number: {str(value)[:100]!r}") from None
    if not math.isfinite(number) or isinstance(value, bool):
        raise VerifierError(VerifierFailure.BAD_REWARD, f"{what} is not a finite number: {value!r}")
    return number
