"""Two env packages pinning conflicting versions of one dependency (six 1.16.0 and 1.17.0), each in
its own venv, played side by side in one batch by one worker; every trajectory and the batch name
each package's version and content digest. `gymflow envs` lists them."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Sequence

from interop_support import record_of, require, tool_calls
from temporalio.client import Client

from gymflow.activities.model import ModelConfig
from gymflow.activities.schema import BatchInput, RolloutOptions
from gymflow.activities.storage import read_trajectories
from gymflow.envs.contract import Message, Task, ToolCall, ToolSpec
from gymflow.envs.packages.install import distribution_digest
from gymflow.envs.policy import Policy
from gymflow.workers.cli.envs import run_envs
from gymflow.workers.cli.main import build_parser
from gymflow.workers.servers.policy import PolicyServer
from gymflow.workers.worker import RunningWorker
from gymflow.workflows.group import BatchRolloutWorkflow


class DependencyThenSum(Policy):
    """Asks the env which six it runs on, then adds the question's numbers and answers."""

    name = "dependency-then-sum"

    def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        results = [m for m in messages if m.role == "tool"]
        if not results:
            return Message(role="assistant", tool_calls=[ToolCall(id="dep", name="dependency")])
        if len(results) == 1:
            a, b = (float(n) for n in messages[1].content.removeprefix("What is ").rstrip("?").split(" + "))
            return Message(role="assistant", tool_calls=[ToolCall(id="add", name="add", arguments={"a": a, "b": b})])
        return Message(role="assistant", content=f"<answer>{results[-1].content}</answer>")


async def test_conflicting_pins_run_side_by_side_in_one_batch(client: Client, worker: RunningWorker) -> None:
    require("pinned-a", "pinned-b")
    tasks = [Task(id=f"sum-{i}", prompt=f"What is {i} + {i * 10}?", ground_truth=i * 11) for i in (1, 2)]
    async with PolicyServer(DependencyThenSum()) as server:
        result = await client.execute_workflow(
            BatchRolloutWorkflow.run,
            BatchInput(
                env="pinned-a",
                also_envs=["pinned-b"],
                tasks=tasks,
                options=RolloutOptions(model=ModelConfig(base_url=server.url)),
            ),
            id=f"batch-pinned-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
    assert result.total == 4 and result.completed == 4 and result.mean_reward == 1.0
    records = {key: record_of(key) for key in ("pinned-a", "pinned-b")}
    assert {(p.name, p.version, p.digest) for p in result.env_packages} == {
        (r.name, r.version, r.digest) for r in records.values()
    }
    trajectories = await read_trajectories(result.parts)
    six = {"pinned-a": "six 1.16.0", "pinned-b": "six 1.17.0"}
    for trajectory in trajectories:
        record, package = records[trajectory.env], trajectory.env_package
        assert package is not None and (package.name, package.version, package.digest) == (
            record.name, record.version, record.digest,
        )  # fmt: skip
        assert package.env == trajectory.env and package.kind == "plain"
        assert tool_calls(trajectory)[0] == ("dependency", {})
        assert trajectory.messages[3].content == six[trajectory.env]  # the observation of `dependency`
    assert sorted(t.env for t in trajectories) == ["pinned-a", "pinned-a", "pinned-b", "pinned-b"]
    # The digest is of the installed code: recomputed from the venv's RECORD, it is the recorded one.
    for record in records.values():
        from importlib import metadata

        (site,) = record.venv.glob("lib/python*/site-packages")
        dist = next(d for d in metadata.distributions(path=[str(site)]) if d.metadata["Name"] == record.name)
        assert distribution_digest(dist) == record.digest
    assert records["pinned-a"].digest != records["pinned-b"].digest


def envs_command(*argv: str) -> str:
    out = io.StringIO()
    assert run_envs(build_parser().parse_args(["envs", *argv]), out=out) == 0
    return out.getvalue()


def test_envs_lists_packages_with_description_tools_tasks_and_policies() -> None:
    require("pinned-a", "pinned-b")
    info = json.loads(envs_command("show", "pinned-a", "--json"))  # `list` says the same of every env
    assert info["description"] == "Add two numbers with the `add` tool; `dependency` says which six this venv has."
    assert [t["name"] for t in info["tools"]] == ["add", "dependency"] and info["tools_error"] is None
    assert info["tasks"] == 4
    assert [p["names"] for p in info["policies"]] == [["reference"], ["null"]]
    assert info["source"].startswith("env package gymflow-example-pinned-a 1.0.0, plain, digest ")
    table = envs_command("list", "--packages")
    row = next(line for line in table.splitlines() if line.startswith("gymflow-example-pinned-b"))
    assert row.split()[:2] == ["gymflow-example-pinned-b", "2.0.0"] and row.endswith("pinned-b")
    shown = envs_command("show", "pinned-b@2.0.0")
    assert "pinned_b:SumsEnv (env package gymflow-example-pinned-b 2.0.0" in shown
    assert "generated: 4 tasks" in shown and "dependency()  The version of six this env runs on" in shown
