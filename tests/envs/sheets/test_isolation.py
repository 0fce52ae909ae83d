"""Model code against the isolation promise, through the real MCP server and `run_python`.

At every mode the runner uses without an opt-out (bubblewrap, with and without a dropped uid),
code sent through `run_python` tries to read the task's answer workbook (0700 cache) and a
world-readable copy of it (as a SpreadsheetBench checkout would be), another rollout's
workspace, `/proc/<pid>/environ` of the worker and of a process holding an API key, files
outside its workspace, and the network: every attempt fails. A mode the machine lacks skips,
naming what is missing; .ci/run (GYMFLOW_SANDBOX_REQUIRE=bwrap) turns that skip into a failure.
Without a guaranteeing level (forced with GYMFLOW_BWRAP=/nonexistent) the env says it cannot work
here, the CLI refuses to start it, `run_python` refuses with the fix named, and the opt-out is
recorded. At every mode model code may run in, opted-out ones included, a fork bomb sent through
`run_python` stays within the process limit, and nothing of it outlives the call.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from process_census import SPAWN_200, UNBOUNDED, Census, programs_left

from gymflow.envs.builtin.sheets.env import SheetsEnv, server_config
from gymflow.envs.builtin.sheets.isolation import SANDBOX_ENV, choose
from gymflow.envs.builtin.sheets.sandbox import REQUIRE_ENV, Guarantee, Level, Limits, guarantees, is_root, probe
from gymflow.envs.contract import Task, ToolResult
from gymflow.envs.runtime.confine import BWRAP_ENV

REPO = Path(__file__).resolve().parents[3]
MARKER = "gymflow-isolation-secret-7d1f"
MODES = [(Level.BWRAP, True), (Level.BWRAP, False)]
NEEDS_BWRAP = "needs bubblewrap: apt-get install bubblewrap"

PROGRAM = """
import glob, json, os, socket
targets = json.loads({targets!r})
out = {{}}
for name, path in targets["files"].items():
    try:
        with open(path, "rb") as f:
            out[name] = "READ " + f.read(200).hex()
    except OSError as exc:
        out[name] = "refused " + type(exc).__name__
try:
    out["other workspace listing"] = "READ " + ",".join(os.listdir(targets["other"]))
except OSError as exc:
    out["other workspace listing"] = "refused " + type(exc).__name__
found = []
for path in glob.glob("/proc/*/environ"):
    try:
        if targets["marker"].encode() in open(path, "rb").read():
            found.append(path)
    except OSError:
        pass
out["any environ with the key"] = "READ " + ",".join(found) if found else "refused none"
try:
    socket.create_connection(("127.0.0.1", targets["port"]), timeout=3).close()
    out["network"] = "READ connected"
except OSError as exc:
    out["network"] = "refused " + type(exc).__name__
interfaces = [n for _, n in socket.if_nameindex() if n != "lo"]
out["interfaces"] = "READ " + ",".join(interfaces) if interfaces else "refused only lo"
print("RESULT " + json.dumps(out))
"""


@pytest.fixture
def keyholder() -> Iterator[int]:
    """A process with an API key in its environment, like a worker: its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env={**os.environ, "GYMFLOW_MODEL_API_KEY": MARKER},
    )
    yield proc.pid
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def outside(listener: int, keyholder: int) -> tuple[int, int]:
    """What lives outside the sandbox: a listening port on the host and a process holding a key."""
    return listener, keyholder


@pytest.fixture(params=MODES, ids=[f"{level}-{'own-uid' if own else 'caller-uid'}" for level, own in MODES])
async def confined(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SheetsEnv]:
    """The env with its servers forced to one guaranteeing mode."""
    level, own_uid = request.param
    if own_uid and not is_root():
        pytest.skip("dropping to a sandbox uid needs root")
    reason = probe(level, own_uid=own_uid)
    if reason is not None:
        if os.environ.get(REQUIRE_ENV) == level:
            pytest.fail(f".ci/run installed {level} but it does not work: {reason}")
        pytest.skip(f"{level} is not available here ({reason}): {NEEDS_BWRAP}")
    root = tmp_path_factory.mktemp("isolation-ws")
    servers = server_config(level=level, own_uid=own_uid, limits=Limits())
    env = SheetsEnv(workspace_root=root, pool_size=0, servers=servers, sandbox_level="auto")
    try:
        yield env
    finally:
        await env.shutdown()


async def _call(env: SheetsEnv, rollout: str, tool: str, **args: object) -> ToolResult:
    result = await env.run_tool(rollout, tool, **args)
    assert isinstance(result, ToolResult)
    return result


async def test_model_code_reaches_nothing_but_its_workspace(
    confined: SheetsEnv, tasks: list[Task], answers: dict[str, str], tmp_path: Path, outside: tuple[int, int]
) -> None:
    listener, keyholder = outside
    task = tasks[1]
    answer = Path(answers[task.id])
    bench = tmp_path / "bench"  # a SpreadsheetBench checkout: world-readable
    bench.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    public = bench / answer.name
    shutil.copyfile(answer, public)
    public.chmod(0o644)
    await confined.init_rollout("victim", **task.init_args)
    await confined.init_rollout("attacker", **task.init_args)
    try:
        planted = await _call(confined, "victim", "run_python", code=f"open('secret.txt', 'w').write({MARKER!r})")
        assert not planted.is_error, planted.text
        other = confined.workspace("victim")
        files = {
            "answer (0700 cache)": str(answer),
            "answer (world-readable)": str(public),
            "other rollout's file": str(other / "secret.txt"),
            "other rollout's input": str(other / "input.xlsx"),
            "worker environ": f"/proc/{os.getpid()}/environ",
            "keyholder environ": f"/proc/{keyholder}/environ",
            "/etc/passwd": "/etc/passwd",
            "repository": str(REPO / "pyproject.toml"),
            "root's home": "/root/.bashrc",
        }
        targets = {"files": files, "other": str(other), "marker": MARKER, "port": listener}
        result = await _call(confined, "attacker", "run_python", code=PROGRAM.format(targets=json.dumps(targets)))
        assert not result.is_error, result.text
        line = next(x for x in result.text.splitlines() if x.startswith("RESULT "))
        outcomes = json.loads(line.removeprefix("RESULT "))
        leaked = {name: outcome for name, outcome in outcomes.items() if not outcome.startswith("refused")}
        assert leaked == {}, leaked
        assert len(outcomes) == len(files) + 4
        assert MARKER not in result.text
    finally:
        await confined.release_rollout("victim")
        await confined.release_rollout("attacker")


async def test_without_a_guaranteeing_level_run_python_refuses_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tasks: list[Task], answers: dict[str, str]
) -> None:
    monkeypatch.setenv(BWRAP_ENV, "/nonexistent")  # a machine without bubblewrap; never uninstall it
    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    isolation = choose()
    assert isolation.refuse_code and isolation.level is not Level.BWRAP
    problem = SheetsEnv.unavailable()
    assert problem is not None and "apt-get install bubblewrap" in problem.fix and "unsafe-unshare" in problem.fix
    assert "bubblewrap" in problem.reason
    assert SheetsEnv.preflight() is None  # not a warning: the env cannot work, and `unavailable` says so
    env = SheetsEnv(workspace_root=tmp_path, pool_size=0)  # driven directly, run_python still refuses
    assert env.isolation_record() is None  # refusing is not an opt-out: nothing ran
    task = tasks[1]
    await env.init_rollout("refused", **task.init_args)
    try:
        code = f"print(open({answers[task.id]!r}, 'rb').read()[:4])"
        refused = await _call(env, "refused", "run_python", code=code)
        assert refused.is_error and "apt-get install bubblewrap" in refused.text
        assert "PK" not in refused.text
        described = await _call(env, "refused", "describe_workbook")  # the env's own tools still work
        assert not described.is_error and "'Orders'" in described.text
    finally:
        await env.release_rollout("refused")
        await env.shutdown()


def test_weaker_levels_need_the_explicit_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    for bare in ("unshare", "rlimits", "none"):
        with pytest.raises(Exception, match="only bwrap guarantees isolation"):
            choose(bare)
    opted = choose("unsafe-rlimits")
    assert opted.level is Level.RLIMITS
    if Guarantee.PROCESS_LIMIT not in guarantees(opted.level, own_uid=opted.own_uid):
        assert opted.refuse_code and "pids cgroup" in opted.fix  # an opt-out still bounds processes
        return
    assert opted.unsafe and not opted.refuse_code
    record = opted.record()
    assert record is not None and record.startswith(f"{SANDBOX_ENV}=unsafe-rlimits") and "fs_confined" in record
    monkeypatch.setenv(SANDBOX_ENV, "unsafe-rlimits")
    notice = SheetsEnv.preflight()
    assert notice is not None and "WARNING" in notice and "unsafe-rlimits" in notice


def test_the_cli_refuses_an_env_that_cannot_work_here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gymflow.workers.cli.main import main

    monkeypatch.setenv(BWRAP_ENV, "/nonexistent")
    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    for argv in (["eval", "sheets", "--n", "2"], ["rollout", "sheets"], ["demo", "sheets"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("gymflow: sheets cannot work on this node:"), err
        assert "bubblewrap" in err and "Fix: install bubblewrap (apt-get install bubblewrap)" in err
    monkeypatch.setenv(SANDBOX_ENV, "unsafe-rlimits")  # the opt-out still runs: a warning, no refusal
    from gymflow.workers.cli.commands import preflight

    if SheetsEnv.unavailable() is None:
        preflight("sheets")
        assert capsys.readouterr().err.startswith("gymflow: WARNING: isolation opted out")
    preflight("math")  # runs no model code: nothing to say
    assert capsys.readouterr().err == ""


EVERY_MODE = [(level, own) for level in Level for own in (True, False)]


@pytest.mark.parametrize(
    ("level", "own_uid"), EVERY_MODE, ids=[f"{lv}-{'own' if own else 'caller'}-uid" for lv, own in EVERY_MODE]
)
async def test_a_fork_bomb_through_run_python_is_contained(
    level: Level, own_uid: bool, tmp_path: Path, tasks: list[Task]
) -> None:
    """Every mode model code may run in (bwrap; unshare and rlimits behind the opt-out)."""
    if own_uid and not is_root():
        pytest.skip("dropping to a sandbox uid needs root")
    reason = probe(level, own_uid=own_uid)
    if reason is not None:
        pytest.skip(f"mode {level} ({'own' if own_uid else 'caller'} uid) does not work here: {reason}")
    if Guarantee.PROCESS_LIMIT not in guarantees(level, own_uid=own_uid):
        pytest.skip(f"{level} at the caller's uid promises no process limit here: no fork bomb is sent to it")
    limits = Limits(cpu_s=2, wall_s=5.0, processes=16)
    servers = server_config(level=level, own_uid=own_uid, limits=limits)
    env = SheetsEnv(workspace_root=tmp_path, pool_size=0, servers=servers)
    await env.init_rollout("bomb", **tasks[0].init_args)
    try:
        with Census() as seen:
            bounded = await _call(env, "bomb", "run_python", code=SPAWN_200)
        assert not bounded.is_error and "started" in bounded.text, bounded.text
        started = int(bounded.text.split("started", 1)[1].split()[0])
        assert 0 < started < limits.processes and seen.programs <= limits.processes
        with Census() as seen:
            bomb = await _call(env, "bomb", "run_python", code=UNBOUNDED)
        print(
            f"{level} ({'own' if own_uid else 'caller'} uid) through run_python: at most {seen.programs} sandboxed "
            f"programs (limit {limits.processes}); host processes {seen.baseline} -> at most {seen.host}"
        )
        assert bomb.is_error and ("16-process limit" in bomb.text or "wall-clock" in bomb.text), bomb.text
        assert seen.programs <= limits.processes
        assert programs_left() == 0  # nothing of it outlives the call
        after = await _call(env, "bomb", "run_python", code="print('still serving')")
        assert not after.is_error and "still serving" in after.text
    finally:
        await env.release_rollout("bomb")
        await env.shutdown()
