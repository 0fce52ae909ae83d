"""SheetsEnv with real MCP server processes: baselines, tool errors as observations, the registry."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gymflow.envs.builtin.sheets.env import SheetsEnv
from gymflow.envs.builtin.sheets.policy import ReferencePolicy
from gymflow.envs.builtin.sheets.sandbox import Guarantee
from gymflow.envs.contract import Task, ToolResult
from gymflow.envs.mcp.play import play, play_tasks
from gymflow.envs.policy import NullPolicy
from gymflow.envs.registry import env_class


def test_registered_with_baselines() -> None:
    assert env_class("sheets") is SheetsEnv
    assert isinstance(SheetsEnv.baseline_policy("reference"), ReferencePolicy)
    assert isinstance(SheetsEnv.baseline_policy(), ReferencePolicy)
    assert isinstance(SheetsEnv.baseline_policy("null"), NullPolicy)
    with pytest.raises(ValueError, match="reference or null"):
        SheetsEnv.baseline_policy("oracle")


@pytest.mark.slow  # every task twice; reference rollouts score 1 in tests/envs/sheets/test_rollout.py
@pytest.mark.usefixtures("code_runs")
async def test_reference_scores_one_and_null_zero(sheets_env: SheetsEnv, tasks: list[Task]) -> None:
    picked = [tasks[i] for i in (0, 1, 5, 7)]  # aggregate, lookup, sort, names: formula and value answers
    assert {t.metadata["formula_answer"] for t in picked} == {True, False}
    messages, reward = await play(sheets_env, ReferencePolicy(), picked[0])
    assert reward.total == 1.0, reward.info
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3].content.startswith("exit status 0")
    rewards = await play_tasks(sheets_env, ReferencePolicy(), picked[1:])
    assert [r.total for r in rewards] == [1.0] * 3, [r.info for r in rewards]
    nulls = await play_tasks(sheets_env, NullPolicy(), picked)
    assert [r.total for r in nulls] == [0.0] * 4
    assert sheets_env.live_rollouts() == []


@pytest.mark.usefixtures("code_runs")
@pytest.mark.heavy
async def test_tool_failures_are_observations_and_the_server_goes_on(
    sheets_env: SheetsEnv, tasks: list[Task], answers: dict[str, str]
) -> None:
    task = tasks[1]  # lookup: sheets 'Orders' and 'Price List'
    assert task.metadata["family"] == "lookup"
    answer = answers[task.id]
    await sheets_env.init_rollout("errors", **task.init_args)
    try:

        async def call(tool: str, **args: object) -> ToolResult:
            result = await sheets_env.run_tool("errors", tool, **args)
            assert isinstance(result, ToolResult)
            return result

        sheets = (await call("describe_workbook")).text
        assert "'Orders'" in sheets and "'Price List'" in sheets
        refused = await call("run_python", code=f"print(open({answer!r}, 'rb').read()[:4])")
        assert refused.is_error and ("FileNotFoundError" in refused.text or "PermissionError" in refused.text)
        if Guarantee.NO_NETWORK in sheets_env.sandbox_guarantees():
            net = await call("run_python", code="import socket\nsocket.create_connection(('127.0.0.1', 7233), 2)")
            assert net.is_error and "exit status 1" in net.text
        for tool, args, message in [
            ("read_range", {"ref": "Nope!A1"}, "no sheet 'Nope'; sheets: 'Orders', 'Price List'"),
            ("read_range", {"ref": "A1:", "path": "input.xlsx"}, "incomplete range"),
            ("read_range", {"ref": "A1", "path": "../escape.xlsx"}, "'..' is not allowed"),
            ("describe_workbook", {"path": "missing.xlsx"}, "no file 'missing.xlsx'"),
            ("write_cells", {"cells": {"A1:B2": 1}}, "not a cell name"),
            ("run_python", {"code": "raise SystemExit(4)"}, "exit status 4"),
        ]:
            result = await call(tool, **args)
            assert result.is_error and message in result.text, (tool, result.text)
        junk = await call("run_python", code="open('junk.xlsx', 'wb').write(b'PK junk')")
        assert not junk.is_error
        broken = await call("describe_workbook", path="junk.xlsx")
        assert broken.is_error and "not a valid .xlsx workbook" in broken.text
        written = await call("write_cells", cells={"D2": 1.5, "E2": "=C2*D2"})
        assert not written.is_error and "output.xlsx" in written.text
        read = await call("read_range", ref="Orders!D2:E2", path="output.xlsx")
        assert "D2 = 1.5" in read.text and "E2 = =C2*D2" in read.text
    finally:
        await sheets_env.release_rollout("errors")


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("code_runs")
async def test_reference_scores_one_on_every_generated_task(sheets_env: SheetsEnv) -> None:
    """>= 100 generated tasks, every family, through the MCP server's code runner and the reward."""
    many = list(SheetsEnv.load_dataset("generated", n=108, seed=1))
    families = Counter(t.metadata["family"] for t in many)
    assert len(families) == 9 and min(families.values()) == 12
    rewards = await play_tasks(sheets_env, ReferencePolicy(), many, concurrency=4)
    failed = [(t.id, r.info) for t, r in zip(many, rewards, strict=True) if r.total != 1.0]
    assert failed == []
    assert sum(r.info["recalculated"] > 0 for r in rewards) > 20  # many scored through recalculated formulas
    nulls = await play_tasks(sheets_env, NullPolicy(), many, concurrency=8)
    assert {r.total for r in nulls} == {0.0}


@pytest.mark.usefixtures("code_runs")
async def test_the_workspace_quota_is_an_error_observation(tmp_path: Path, tasks: list[Task]) -> None:
    env = SheetsEnv(workspace_root=tmp_path, pool_size=0, default_workspace_quota_mb=4)
    assert env.quota_mb == 4 and env.limits.workspace_mb == 4
    assert SheetsEnv(workspace_root=tmp_path, workspace_quota_mb=9, default_workspace_quota_mb=4).quota_mb == 9
    await env.init_rollout("quota", **tasks[0].init_args)
    try:
        fill = "import os\nfor i in range(50):\n    open(f'f{i}.bin', 'wb').write(os.urandom(1024 * 1024))"
        over = await env.run_tool("quota", "run_python", code=fill)
        assert isinstance(over, ToolResult) and over.is_error
        assert "4 MB disk quota" in over.text, over.text
        clean = "import glob, os\nfor p in glob.glob('*.bin'):\n    os.remove(p)"
        cleaned = await env.run_tool("quota", "run_python", code=clean)
        assert isinstance(cleaned, ToolResult) and not cleaned.is_error, cleaned.text
        written = await env.run_tool("quota", "write_cells", cells={"A1": 1})
        assert isinstance(written, ToolResult) and not written.is_error, written.text
    finally:
        await env.release_rollout("quota")
        await env.shutdown()
