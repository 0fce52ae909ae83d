"""Finding out what to run, as a new user does (issue 31): `gymflow envs`, `gymflow envs show`, the
common `reference` policy in `gymflow eval`, the README's own env from the CLI, and a custom env's
scripted policy served by `gymflow policy serve`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import httpx
import pytest

from gymflow.envs.catalog import describe_all
from gymflow.envs.errors import DatasetError
from gymflow.envs.mcp.http import free_port
from gymflow.envs.registry import BUILTIN, env_class

ROOT = Path(__file__).parents[2]


def cli(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymflow.workers.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env=os.environ, check=False,
    )  # fmt: skip


@pytest.mark.heavy
def test_gymflow_envs_is_a_table_of_tasks_policies_tools_and_descriptions() -> None:
    run = cli("envs")
    assert run.returncode == 0, run.stderr[-3000:]
    header, *rows, footer = run.stdout.splitlines()
    assert header.split() == ["ENV", "TASKS", "POLICIES", "TOOLS", "DESCRIPTION"]
    starts = [header.index(column) for column in ("POLICIES", "TOOLS", "DESCRIPTION")]
    by_name = {row.split()[0]: row for row in rows}
    assert sorted(by_name) == sorted(BUILTIN)
    for name, row in by_name.items():
        cls = env_class(name)
        tasks = row[: starts[0]].split()[1]
        policies, tools = row[starts[0] : starts[1]].strip(), row[starts[1] : starts[2]].strip()
        if name == "workspace-judge":  # a judge's tasks come from the rollouts it judges; a judge model plays it
            assert tasks == "-" and policies == "null", row
        elif name == "harbor":  # its datasets are directories of task directories: no default one
            assert tasks == "-", row
            with pytest.raises(DatasetError, match="not a directory of Harbor tasks"):
                cls.load_dataset("generated")
        else:
            assert int(tasks) == sum(1 for _ in cls.load_dataset("generated")), row
        if name != "workspace-judge":
            assert "reference" in policies and policies.endswith(", null"), row
        assert int(tools.split(":")[0]) > 0, row
        doc = cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__ or ""
        assert row.endswith(doc.splitlines()[0]), row  # whole: piped output is not cut to a terminal
    assert "calculator=reference, softmax, null" in by_name["math"]
    assert "retrieve=reference, null" in by_name["search"] and "2: search, read" in by_name["search"]
    assert by_name["units"].endswith("Unit conversion with a calculator MCP server: an environment in 30 lines.")
    assert footer.startswith(f"({len(BUILTIN)} envs in ") and footer.endswith("details: gymflow envs show NAME)")


@pytest.mark.slow  # six CLI runs; the table test stays in the default suite
def test_gymflow_envs_json_and_show() -> None:
    listed = json.loads(cli("envs", "--json").stdout)
    assert [e["name"] for e in listed] == sorted(BUILTIN)
    assert all(e["tools"] and e["tools_error"] is None and e["error"] is None for e in listed)
    assert json.loads(cli("envs", "list", "--json").stdout)[0]["name"] == listed[0]["name"]

    shown = cli("envs", "show", "math")
    assert shown.returncode == 0, shown.stderr[-3000:]
    text = shown.stdout
    assert text.startswith("math: Arithmetic with a calculator")
    assert "calculator  python -m gymflow.envs.builtin.math.servers.calculator" in text
    assert "  add(a, b)  " in text and "  evaluate(expression)  " in text  # each tool with its arguments
    assert "  generated: 16 tasks" in text
    assert "  calculator, reference  gymflow.envs.builtin.math.policy:CalculatorPolicy  (default)" in text
    assert "  null                   gymflow.envs.policy:NullPolicy" in text
    detail = json.loads(cli("envs", "show", "search", "--json").stdout)
    assert detail["tasks"] == 80 and [p["names"] for p in detail["policies"]] == [["retrieve", "reference"], ["null"]]

    unknown = cli("envs", "show", "nope")
    assert unknown.returncode == 2 and unknown.stderr.startswith("gymflow: unknown env 'nope'; available: crm,")


DYING = "import sys\nprint('letters: no word list here', file=sys.stderr)\nsys.exit(3)\n"


async def test_one_broken_env_never_hides_the_others(tmp_path: Path) -> None:
    (tmp_path / "dies.py").write_text(DYING)
    broken = tmp_path / "broken.yaml"
    broken.write_text("mcpServers:\n  letters: {command: python, args: [dies.py]}\ndescription: Dies at start.\n")
    declared = tmp_path / "declared.yaml"  # names its tools: listed without starting (its command does not exist)
    declared.write_text("mcpServers:\n  a: {command: no-such-server, allowed_tools: [get, put]}\n")
    started = time.monotonic()
    infos = {i.name: i for i in await describe_all([str(broken), str(declared), "math", "no-such-env"])}
    assert time.monotonic() - started < 30
    bad = infos[str(broken)]
    assert bad.description == "Dies at start." and bad.tools is None and bad.tasks is None
    assert bad.tools_error is not None and bad.tools_error.endswith(
        "exited with code 3; its stderr ends:\n  letters: no word list here"
    )
    assert bad.dataset_error is not None and "no 'dataset' key" in bad.dataset_error
    assert [t.name for t in infos[str(declared)].tools or []] == ["get", "put"] and infos[str(declared)].tools_declared
    assert infos["math"].tools and infos["math"].error is None
    assert infos["no-such-env"].error is not None and infos["no-such-env"].error.startswith("unknown env 'no-such-env'")


def eval_json(temporal_address: str, tmp_path: Path, *args: str) -> dict[str, object]:
    run = cli(
        "eval", *args, "--reps", "200", "--json", "--out", str(tmp_path / "report"),
        "--address", temporal_address, "--task-queue", f"discover-{uuid.uuid4().hex[:8]}", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((tmp_path / "report" / "report.json").read_text())


@pytest.mark.slow  # a whole CLI eval; the policy names are checked by the table test
def test_eval_search_with_the_common_reference_policy(temporal_address: str, tmp_path: Path) -> None:
    report = eval_json(temporal_address, tmp_path, "search", "--policy", "reference", "--n", "6")
    policy = report["policy"]
    assert isinstance(policy, dict) and policy["label"] == "reference" and policy["models"] == ["reference"]
    assert policy["completed"] == 6 and policy["infra_failed"] == 0
    assert policy["mean"]["value"] > 0  # the sample dataset, played by the retrieve-read-extract policy


@pytest.mark.heavy
def test_eval_units_the_readmes_env_runs_from_the_cli(temporal_address: str, tmp_path: Path) -> None:
    report = eval_json(temporal_address, tmp_path, "units")  # no --policy, no --model-url: its reference
    policy = report["policy"]
    assert isinstance(policy, dict) and policy["completed"] == 6 and policy["mean"]["value"] == 1.0


POLICY = """
import re
from gymflow.envs.contract import Message, ToolCall
from gymflow.envs.policy import Policy

class Count(Policy):
    name = "count"

    def respond(self, messages, tools):
        if messages[-1].role == "tool":
            return Message(role="assistant", content=f"<answer>{messages[-1].content}</answer>")
        letter, word = re.search(r"How many (\\w) in (\\w+)", messages[-1].content).groups()
        call = ToolCall(id="c0", name="count", arguments={"word": word, "letter": letter})
        return Message(role="assistant", tool_calls=[call])
"""


def test_policy_serve_serves_an_env_files_scripted_policy(tmp_path: Path) -> None:
    toy = tmp_path / "mytoy"
    toy.mkdir()
    (toy / "policy.py").write_text(POLICY)
    (toy / "letters.yaml").write_text(
        textwrap.dedent("""
        mcpServers:
          letters: {command: python, args: [-m, gymflow.envs.builtin.math.servers.calculator]}
        policies: {count: policy.py:Count}
        """)
    )
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gymflow.workers.cli",
        "policy",
        "serve",
        "mytoy/letters.yaml",
        "--port",
        str(port),
    ]
    server = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "policy server never listened"
                time.sleep(0.1)
        assert models["data"][0]["id"] == "count"
        tool = {"type": "function", "function": {"name": "count", "parameters": {"type": "object", "properties": {}}}}
        body = {
            "model": "count",
            "messages": [{"role": "user", "content": "How many r in strawberry?"}],
            "tools": [tool],
        }
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=10).json()
        (call,) = reply["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "count"
        assert json.loads(call["function"]["arguments"]) == {"word": "strawberry", "letter": "r"}
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_policy_serve_without_a_policy_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "bare.yaml").write_text(
        "mcpServers:\n  c: {command: python, args: [-m, gymflow.envs.builtin.math.servers.calculator]}\n"
    )
    run = cli("policy", "serve", "bare.yaml", cwd=tmp_path, timeout=60)
    assert run.returncode != 0
    assert (
        "bare.yaml has no baseline policy to play it without a model: pass a model endpoint (--model-url URL"
        in run.stderr
    )
