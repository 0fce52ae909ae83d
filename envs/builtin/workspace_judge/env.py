"""workspace-judge: an agentic judge, a model with tools that inspects what a rollout left behind.

A judge that reads only the transcript cannot tell a claimed refund from a made one. This env gives
the judge model read-only tools over a snapshot of the judged rollout's workspace (`list_files`,
`read_file`, `query_db` on its SQLite files: gymflow.envs.builtin.workspace_judge.server) and
asks it for a score in ``<score>0..1</score>``. The rollout workflow runs it as a child rollout
(`RolloutInput.agentic_judge`, gymflow.workflows.judging.agentic_judge) on the judged rollout's
node, before the judged rollout's state is released, with its own model, turn and tool budgets;
every judge turn and tool call is an activity of the child, in the Web UI and `gymflow inspect`.

* The snapshot is a copy (regular files and directories; no links, devices or sockets; at most
  `MAX_SNAPSHOT_BYTES`), made read-only, so nothing the judge does reaches the judged rollout.
* The source must be a rollout workspace of this node (``NODE_ROOT/ENV/ws-*``, beside the judge's
  own): a task naming any other path is refused as invalid input.
* A judge that ends without a well-formed score fails its reward: the judged rollout ends
  `reward_error`, infra-failed, never scored.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from gymflow.envs.builtin.workspace_judge.server import SNAPSHOT
from gymflow.envs.contract import Message, Reward
from gymflow.envs.mcp.env import McpEnv
from gymflow.envs.rewards.agentic import score_of

MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024

SYSTEM_PROMPT = """You are a strict judge of another agent's work. The task it was given and its \
transcript are below the instructions. Do not trust what the agent says it did: check it with the tools, \
which read a snapshot of the agent's workspace (its files and databases) as the agent left it.
When you are sure, end with your score between 0 and 1 as <score>X</score> and one sentence of reason."""


class WorkspaceJudgeEnv(McpEnv):
    """Read-only tools over a snapshot of another rollout's workspace; the reward is the judge's score."""

    name = "workspace-judge"
    system_prompt = SYSTEM_PROMPT
    mcp_servers = {"judged": {"command": "python", "args": ["-m", "gymflow.envs.builtin.workspace_judge.server"]}}

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        """Snapshot ``source`` (a workspace on this worker) into the judge's workspace, read-only."""
        source = rollout_args.pop("source", None)
        if not isinstance(source, str) or not source:
            raise ValueError("workspace-judge init_args need 'source': the judged rollout's workspace")
        path = await asyncio.to_thread(self._source, source)
        await super().init_rollout(rollout_id, **rollout_args)
        try:
            await asyncio.to_thread(snapshot, path, self.workspace(rollout_id) / SNAPSHOT)
        except BaseException:
            await self.release_rollout(rollout_id)
            raise

    def _source(self, source: str) -> Path:
        """`source` resolved, if it is a rollout workspace of an env on this node: a ``ws-*`` directory
        of an env's root beside this env's own (`NODE_ROOT/ENV/ws-...`)."""
        node, path = self.workspace_root.resolve().parent, Path(source).resolve()
        if not (path.parent.parent == node and path.name.startswith("ws-") and path.is_dir()):
            raise ValueError(f"workspace-judge: {source!r} is not a rollout workspace under {node}")
        return path

    async def compute_reward(
        self, rollout_id: str, completion: list[Message], ground_truth: Any, **kwargs: Any
    ) -> Reward:
        del rollout_id, ground_truth, kwargs
        final = next((m.content for m in reversed(completion) if m.role == "assistant" and m.content), "")
        score = score_of(final)
        return Reward(total=score, components={"judge": score}, info={"reason": final[-500:]})


def snapshot(source: Path, target: Path, *, max_bytes: int = MAX_SNAPSHOT_BYTES) -> int:
    """Copy the regular files and directories of `source` to `target` (links and special files are
    left out), then make the copy read-only; returns the bytes copied.

    Raises:
        ValueError: The source holds more than `max_bytes`.
    """
    copied = 0
    for directory, dirs, files in os.walk(source, followlinks=False):
        here = Path(directory)
        out = target / here.relative_to(source)
        out.mkdir(parents=True, exist_ok=True)
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
        for name in files:
            path = here / name
            info = path.lstat()
            if not stat.S_ISREG(info.st_mode):
                continue
            copied += info.st_size
            if copied > max_bytes:
                raise ValueError(f"the judged workspace holds more than {max_bytes} bytes")
            shutil.copyfile(path, out / name, follow_symlinks=False)
    for directory, _dirs, files in os.walk(target):
        for name in files:
            os.chmod(Path(directory) / name, 0o444)
    return copied
