"""The spreadsheet environment: SpreadsheetBench-style workbook tasks with a sandboxed code runner.

Each rollout gets a workspace holding ``input.xlsx`` and one MCP server process
(`gymflow.envs.builtin.sheets.servers.workbook`) whose tools all run in the sandbox. The model saves
``output.xlsx``; the reward compares its answer cells with the expected ones, recalculating
formulas (`gymflow.envs.builtin.sheets.rewards`). Answers are never in the workspace.

Design decisions:

* The sandbox policy (`gymflow.envs.builtin.sheets.isolation`: level, own uid, whether model code may run) is
  chosen once per worker, when the env is built, and passed to every server on its command line,
  so servers start without probing and all rollouts of a worker are isolated alike. Without a
  mode that guarantees isolation and a process limit (bubblewrap; as root, a dropped uid or a
  pids cgroup), the env cannot work on this node (`unavailable`, naming the fix): the CLI refuses
  to start it and a worker ends its rollouts ``env_unavailable``, never a score of 0 for refused
  code. ``sandbox_level="unsafe-unshare"`` (or ``GYMFLOW_SANDBOX``) runs model code anyway, and
  every trajectory records it. A named level that is unavailable fails the env's construction.
* Replayable: the workspace is a function of the input and the tool calls (programs that read the
  clock or randomness aside), so after a lost node the workflow rebuilds it by re-running them.
* Tool timeouts: the server's per-call limit is the sandbox wall time plus a margin, so the
  model sees the sandbox's own "ran longer than Ns" error, and the server is not killed for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from gymflow.envs.builtin.sheets.data import INPUT_NAME, OUTPUT_NAME, input_bytes, load_generated, load_spreadsheetbench
from gymflow.envs.builtin.sheets.isolation import CHOICES, SANDBOX_ENV, Isolation, choose
from gymflow.envs.builtin.sheets.rewards import expected_from, extract_output, score
from gymflow.envs.builtin.sheets.sandbox import Guarantee, Level, Limits, SandboxUnavailable, guarantees
from gymflow.envs.contract import Message, Reward, Task, Unavailable
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.runtime.workspace import DEFAULT_QUOTA_MB

SYSTEM_PROMPT = f"""You are a spreadsheet expert. Each task gives an instruction about the Excel workbook \
{INPUT_NAME} in your working directory, the cells that must hold the answer (the answer position) and a \
preview of the workbook.

Work through the tools: run_python runs a Python program (openpyxl is installed) in a sandbox whose \
working directory holds {INPUT_NAME}; describe_workbook, read_range and write_cells inspect and edit \
cells directly. Save the finished workbook as {OUTPUT_NAME}, keeping every sheet, e.g.
    import openpyxl
    wb = openpyxl.load_workbook("{INPUT_NAME}")
    ...
    wb.save("{OUTPUT_NAME}")
Values or formulas both count: formulas are recalculated when your answer is checked. Only the cells of \
the answer position in {OUTPUT_NAME} are compared. When {OUTPUT_NAME} is saved, reply with a one-line \
summary and no tool call."""

_log = logging.getLogger(__name__)
SERVER_MODULE = "gymflow.envs.builtin.sheets.servers.workbook"
TOOL_TIMEOUT_MARGIN_S = 30.0
"""Added to the sandbox wall time to get the server's per-call timeout."""


def server_config(*, level: Level, own_uid: bool, limits: Limits, refuse_code: bool = False) -> dict[str, Any]:
    """The `mcpServers` entry of the workbook server for one sandbox mode."""
    args = ["-m", SERVER_MODULE, "--level", str(level), "--own-uid" if own_uid else "--caller-uid"]
    args += ["--refuse-code"] if refuse_code else []
    args += ["--cpu-s", str(limits.cpu_s), "--wall-s", str(limits.wall_s), "--memory-mb", str(limits.memory_mb)]
    args += ["--file-mb", str(limits.file_mb), "--processes", str(limits.processes)]
    args += ["--workspace-mb", str(limits.workspace_mb)] if limits.workspace_mb is not None else []
    return {"sheets": {"command": "python", "args": args, "tool_timeout_s": limits.wall_s + TOOL_TIMEOUT_MARGIN_S}}


class SheetsEnv(McpEnv):
    """Workbook tasks: tools in a sandbox, reward by recalculated answer cells."""

    name = "sheets"
    system_prompt = SYSTEM_PROMPT
    replayable = True
    cpu_bound = True
    mcp_servers = {"sheets": {"command": "python", "args": ["-m", SERVER_MODULE]}}
    policies = {
        "reference": "gymflow.envs.builtin.sheets.policy:ReferencePolicy"
    }  # runs generated tasks' reference programs
    sandbox_setting: ClassVar[str | None] = None
    """The sandbox policy when the constructor gets no ``sandbox_level`` (None: $GYMFLOW_SANDBOX). A
    subclass that fixes its policy sets it here, where `unavailable` (asked before any instance
    exists) sees it too."""

    def __init__(
        self,
        *,
        sandbox_level: str | None = None,
        limits: Limits | None = None,
        partial_weight: float = 0.0,
        **kwargs: Any,
    ) -> None:
        """Args:
        sandbox_level: ``auto``, ``bwrap``, ``unsafe-unshare``, ``unsafe-rlimits`` (see
            `gymflow.envs.builtin.sheets.isolation`), or None for `sandbox_setting`, else $GYMFLOW_SANDBOX
            (default ``auto``).
        limits: Limits of each code run (default `Limits()`); its `workspace_mb` is the env's
            workspace quota (`workspace_quota_mb`, McpEnv's).
        partial_weight: Weight of the cell-accuracy component in the total (0: binary reward).
        **kwargs: McpEnv's (workspace_root, pool_size, servers).
        """
        if not 0.0 <= partial_weight <= 1.0:
            raise ValueError(f"partial_weight must be in [0, 1], got {partial_weight}")
        self.isolation: Isolation = choose(sandbox_level or self.sandbox_setting)
        if self.isolation.notice():
            _log.warning("%s", self.isolation.notice())
        self.sandbox_level, self.own_uid = self.isolation.level, self.isolation.own_uid
        quota = self.resolve_quota(
            kwargs.get("workspace_quota_mb"), kwargs.get("default_workspace_quota_mb", DEFAULT_QUOTA_MB)
        )
        self.limits = dataclasses.replace(limits or Limits(), workspace_mb=quota)
        self.partial_weight = partial_weight
        refuse = self.isolation.refuse_code
        config = server_config(level=self.sandbox_level, own_uid=self.own_uid, limits=self.limits, refuse_code=refuse)
        kwargs.setdefault("servers", config)
        super().__init__(**kwargs)

    def sandbox_guarantees(self) -> frozenset[Guarantee]:
        """What this env's sandbox promises (see `gymflow.envs.builtin.sheets.sandbox.Guarantee`)."""
        return guarantees(self.sandbox_level, own_uid=self.own_uid)

    def isolation_record(self) -> str | None:
        """The opt-out (``unsafe-`` level) every trajectory records, if the operator chose one."""
        return self.isolation.record()

    @classmethod
    def unavailable(cls, **env_kwargs: Any) -> Unavailable | None:
        """Says why, when ``run_python`` would refuse model code here (no sandbox keeps both promises)."""
        try:
            isolation = choose(env_kwargs.get("sandbox_level") or cls.sandbox_setting)
        except SandboxUnavailable as exc:
            fix = f"set {SANDBOX_ENV} (or the env's sandbox_level) to one of {', '.join(CHOICES)} that works here"
            return Unavailable(f"its sandbox setting cannot work here: {exc}", fix)
        if isolation.refuse_code:
            return Unavailable(f"run_python would refuse model code: {isolation.why}", isolation.fix)
        return None

    @classmethod
    def preflight(cls) -> str | None:
        """Says so when model code runs under an opted-out weaker sandbox."""
        try:
            isolation = choose(cls.sandbox_setting)
        except SandboxUnavailable:
            return None  # `unavailable` says it
        return None if isolation.refuse_code else isolation.notice()

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """Stage the task's input workbook (``input_path``, ``generator``) as input.xlsx and start the server."""
        input_path = rollout_args.pop("input_path", None)
        generator = rollout_args.pop("generator", None)
        if input_path is not None:
            if not isinstance(input_path, str) or not (generator is None or isinstance(generator, dict)):
                raise ValueError("sheets init_args: 'input_path' must be a string and 'generator' an object")
            # Generating a missing workbook is openpyxl work: in the node's process pool, off the GIL.
            data = await self.admission.cpu(input_bytes, input_path=input_path, generator=generator)
            rollout_args["files"] = {**(rollout_args.get("files") or {}), INPUT_NAME: data}
        await super().init_rollout(rollout_id, **rollout_args)

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        """Compare output.xlsx's answer cells (recalculated, in the sandbox) with the expected ones."""
        del completion, kwargs
        workspace = self.workspace(rollout_id)
        expected = await self.admission.cpu(expected_from, ground_truth)  # may read the answer workbook
        # The extraction runs in a sandboxed subprocess; the thread only waits for it.
        extracted = await asyncio.to_thread(
            extract_output,
            workspace,
            expected.areas,
            level=self.sandbox_level,
            own_uid=self.own_uid,
            nice=self.admission.nice,
        )
        return score(expected, extracted, partial_weight=self.partial_weight)

    @classmethod
    def load_dataset(cls, name: str, **kwargs: Any) -> Iterable[Task]:
        """``generated`` (kwargs n, seed, root) or the path of a SpreadsheetBench directory (kwarg n: limit)."""
        if name == "generated":
            root = kwargs.get("root")
            return load_generated(int(kwargs.get("n", 16)), seed=int(kwargs.get("seed", 0)), root=root and Path(root))
        limit = kwargs.get("n")
        return load_spreadsheetbench(Path(name), limit=None if limit is None else int(limit))
