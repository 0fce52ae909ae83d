"""Every command's common error paths, run as a user runs them: the `gymflow` console script.

No server at an address (a free port nothing listens on), a mistyped env or policy name, a bad
file (a malformed task file, a run config that is not YAML, a missing dataset), a bad setting:
each ends in one `gymflow...` line naming the fix and exit code 2, never a traceback, never the
SDK's interpreter-teardown abort (``Fatal Python error: PyGILState_Release``, exit 134). A few
successful commands are run too: they leave through the same path.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from temporalio.client import Client

from gymflow.envs.builtin.math.policy import CalculatorPolicy
from gymflow.envs.mcp.http import free_port
from gymflow.workers.servers.policy import AppServer
from support import SlowModel

ROOT = Path(__file__).parents[2]
GYMFLOW = Path(sys.executable).parent / "gymflow"
CORPUS = ROOT / "envs" / "builtin" / "search" / "sample_corpus"
TRAIN_CONFIG = ROOT / "envs" / "examples" / "train_math.yaml"

pytestmark = pytest.mark.skipif(not GYMFLOW.is_file(), reason=f"no console script at {GYMFLOW} (pip install -e .)")


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    """Arguments; {free} is an address nothing listens on, {server} the session's dev server,
    {tmp} the test's directory (with bad.jsonl, bad.yaml, nope.yaml in it)."""
    says: str
    """A fragment of the last stderr line."""
    code: int = 2
    env: dict[str, str] = field(default_factory=dict)


CASES = {
    # No Temporal server at the address.
    "rollout/no-server": Case(("rollout", "math", "--address", "{free}"), "no Temporal server at"),
    "eval/no-server": Case(("eval", "math", "--address", "{free}"), "no Temporal server at"),
    "status/no-server": Case(("status", "--address", "{free}"), "no Temporal server at"),
    "inspect/no-server": Case(("inspect", "r1", "--address", "{free}"), "no Temporal server at"),
    "worker/no-server": Case(("worker", "--address", "{free}"), "start one with `gymflow server`"),
    "dataset/no-server": Case(
        ("dataset", "generate", "--source", f"corpus:{CORPUS}", "--n", "3", "--address", "{free}"),
        "no Temporal server at",
    ),
    "train-launch/no-server": Case(("train", "launch", str(TRAIN_CONFIG), "--address", "{free}"), "no Temporal server"),
    "train-list/no-server": Case(("train", "list", "--address", "{free}"), "no Temporal server at"),
    "train-status/no-server": Case(("train", "status", "r1", "--address", "{free}"), "no Temporal server at"),
    # A mistyped env.
    "rollout/bad-env": Case(("rollout", "nope", "--address", "{free}"), "unknown env 'nope'; available:"),
    "eval/bad-env": Case(("eval", "nope", "--address", "{free}"), "unknown env 'nope'; available:"),
    "demo/bad-env": Case(("demo", "nope", "--address", "{free}", "--data-dir", "{tmp}/data"), "unknown env 'nope'"),
    "policy/bad-env": Case(("policy", "serve", "nope"), "unknown env 'nope'; available:"),
    "dataset/bad-env": Case(
        ("dataset", "generate", "--source", "env:nope", "--n", "3", "--address", "{server}"), "unknown env 'nope'"
    ),
    "train/bad-env": Case(("train", "launch", "{tmp}/nope.yaml", "--address", "{free}"), "env: unknown env 'nope'"),
    # A mistyped baseline policy.
    "rollout/bad-policy": Case(("rollout", "math", "--policy", "calculatr", "--address", "{free}"), "choose"),
    "eval/bad-policy": Case(("eval", "math", "--policy", "calculatr", "--address", "{free}"), "choose calculator"),
    "eval/bad-baseline": Case(("eval", "math", "--baseline", "nul", "--address", "{free}"), "no baseline policy 'nul'"),
    "policy/bad-policy": Case(("policy", "serve", "math", "--policy", "calculatr"), "choose calculator"),
    # A bad file.
    "rollout/bad-task-file": Case(
        ("rollout", "math", "--dataset", "{tmp}/bad.jsonl", "--address", "{free}"), "bad.jsonl:2: invalid JSON"
    ),
    "eval/bad-task-file": Case(
        ("eval", "math", "--dataset", "{tmp}/bad.jsonl", "--n", "2", "--address", "{server}"),
        "bad.jsonl:2: invalid JSON",
    ),
    "train/not-yaml": Case(("train", "launch", "{tmp}/bad.yaml", "--address", "{free}"), "not valid YAML"),
    "train/no-file": Case(("train", "launch", "{tmp}/missing.yaml", "--address", "{free}"), "cannot read"),
    "dataset/no-corpus": Case(
        ("dataset", "generate", "--source", "corpus:{tmp}/missing", "--n", "3", "--address", "{server}"),
        "does not exist",
    ),
    "dataset-show/no-dataset": Case(("dataset", "show", "{tmp}/missing"), "missing"),
    # A name the server does not know.
    "inspect/unknown-id": Case(("inspect", "no-such-rollout", "--address", "{server}"), "not found"),
    "train-status/unknown-run": Case(("train", "status", "no-such-run", "--address", "{server}"), "not found"),
    # A bad setting.
    "rollout/bad-setting": Case(
        ("rollout", "math", "--address", "{free}"), "invalid setting", env={"GYMFLOW_MCP_POOL_SIZE": "-1"}
    ),
    "rollout/bad-key": Case(
        ("rollout", "math", "--address", "{free}"), "GYMFLOW_ENCRYPTION_KEY", env={"GYMFLOW_ENCRYPTION_KEY": "x"}
    ),
    "codec-server/bad-key": Case(("codec-server",), "GYMFLOW_ENCRYPTION_KEY", env={"GYMFLOW_ENCRYPTION_KEY": "x"}),
    "deploy/bad-nodes": Case(("deploy", "workers", "--nodes", "0", "--dryrun"), "nodes"),
    # Successes leave through the same path.
    "status/ok": Case(("status", "--address", "{server}"), "", code=0),
    "envs/ok": Case(("envs",), "", code=0),
    "rollout/ok": Case(("rollout", "math", "--n", "1", "--address", "{server}"), "", code=0),
}


async def gymflow(args: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """The console script's exit code, stdout and stderr (asynchronously: the session server's
    fixtures live in this event loop)."""
    process = await asyncio.create_subprocess_exec(
        str(GYMFLOW), *args, cwd=cwd, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 110)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def files(tmp: Path) -> None:
    (tmp / "bad.jsonl").write_text('{"id": "t1", "prompt": "1 + 1?", "ground_truth": "2"}\n{"id": "t2", "prompt": \n')
    (tmp / "bad.yaml").write_text("env: math\ntrainer: [unclosed\n")
    (tmp / "nope.yaml").write_text(TRAIN_CONFIG.read_text().replace("env: math", "env: nope"))


DEFAULT = frozenset(
    {
        "eval/no-server", "worker/no-server", "eval/bad-env", "policy/bad-policy", "eval/bad-task-file",
        "train/not-yaml", "inspect/unknown-id", "rollout/bad-setting", "rollout/ok",
    }
)  # fmt: skip
"""One case of each kind runs by default; every case with `pytest -m slow` (each is a CLI process)."""


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in CASES])
async def test_error_path(name: str, tmp_path: Path, temporal_address: str) -> None:
    case = CASES[name]
    files(tmp_path)
    values = {"free": f"127.0.0.1:{free_port()}", "server": temporal_address, "tmp": str(tmp_path)}
    args = [a.format(**values) for a in case.args]
    # A queue of the test's own; train configs resolve their trainer's workdir against the cwd.
    queue = {"GYMFLOW_TASK_QUEUE": f"errors-{uuid.uuid4().hex[:8]}", "GYMFLOW_DATA_DIR": str(tmp_path / "data")}
    code, out, err = await gymflow(args, cwd=ROOT, env={**queue, **case.env})
    assert "Fatal Python error" not in err and code != 134 and code >= 0, f"aborted ({code}):\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    assert code == case.code, f"exit {code}, expected {case.code}:\n{err[-3000:]}"
    if case.code:
        last = err.strip().splitlines()[-1]
        assert last.startswith("gymflow") and case.says in last, err[-3000:]
    else:
        assert out.strip(), err[-3000:]


@pytest.mark.heavy
async def test_ctrl_c_says_where_the_workflows_wait(client: Client, temporal_address: str, tmp_path: Path) -> None:
    """An interrupted command leaves through the same path: exit 130, and the queue its work waits on."""
    held = SlowModel(CalculatorPolicy())
    async with AppServer(held) as model:
        process = await asyncio.create_subprocess_exec(
            str(GYMFLOW), "rollout", "math", "--n", "2", "--model-url", model.url, "--address", temporal_address,
            cwd=tmp_path, env={**os.environ, "GYMFLOW_TASK_QUEUE": f"ctrl-c-{uuid.uuid4().hex[:8]}"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while held.waiting < 2:  # both rollouts are in a model turn
                assert process.returncode is None and asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.1)
            process.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(process.communicate(), 60)
        finally:
            held.release.set()
            if process.returncode is None:
                process.kill()
                await process.wait()
    text = err.decode()
    assert process.returncode == 130 and "Traceback" not in text and "Fatal Python error" not in text, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("gymflow: interrupted:") and "gymflow worker --task-queue ctrl-c-" in last, last
    queue = last.split("`gymflow worker --task-queue ")[1].split("`")[0]
    left = [e async for e in client.list_workflows(f'TaskQueue = "{queue}" AND ExecutionStatus = "Running"')]
    assert len(left) == 2  # waiting there, as it says
    for execution in left:
        await client.get_workflow_handle(execution.id).terminate("test over")


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`gymflow envs show units | head -1`: the reader closed before the command wrote a line."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE, as it does after `head` exits
    try:
        done = subprocess.run(
            [str(GYMFLOW), "envs", "show", "units"], stdout=write_end, stderr=subprocess.PIPE, text=True,
            timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Fatal Python error" not in done.stderr
