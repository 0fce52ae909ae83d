"""A benchmax `BaseEnv` written as benchmax users write them: tools, a workspace per rollout, a reward.

The model writes a word to a note in its rollout's workspace and reads it back; the reward checks
the note on disk (the workspace outlives the tool calls until release) and the final answer. Its
methods mix sync and async the way benchmax's own envs do.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from benchmax.envs.base_env import BaseEnv
from benchmax.envs.types import StandardizedExample, ToolDefinition

NOTE = "note.txt"


class NotesEnv(BaseEnv):
    """Write a word to a note in the rollout's workspace, read it back, answer with it."""

    system_prompt = (
        "Write the word to the note with write_note, read it back with read_note, then answer <answer>WORD</answer>."
    )

    def __init__(self, **kwargs: Any) -> None:
        self.root = Path(kwargs.get("workspace_dir", "notes-workspaces")).resolve()
        self.workspaces: dict[str, Path] = {}

    async def list_tools(self) -> list[ToolDefinition]:
        return [
            ToolDefinition(
                "write_note",
                "Write text to the note",
                {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            ),
            ToolDefinition("read_note", "Read the note", {"type": "object", "properties": {}}),
        ]

    async def init_rollout(self, rollout_id: str, **rollout_args: Any) -> None:
        workspace = self.root / uuid.uuid4().hex
        workspace.mkdir(parents=True)
        self.workspaces[rollout_id] = workspace
        if rollout_args.get("seed_text"):
            (workspace / NOTE).write_text(str(rollout_args["seed_text"]))

    def run_tool(self, rollout_id: str, tool_name: str, **tool_args: Any) -> Any:  # sync, as LocalMCPEnv's is
        note = self.workspaces[rollout_id] / NOTE
        if tool_name == "write_note":
            note.write_text(tool_args["text"])
            return f"wrote {len(tool_args['text'])} characters"
        if tool_name == "read_note":
            return note.read_text() if note.exists() else ""
        raise ValueError(f"no tool {tool_name}")

    async def copy_to_workspace(self, rollout_id: str, src_path: Path, dst_filename: str | None = None) -> None:
        shutil.copyfile(src_path, self.workspaces[rollout_id] / (dst_filename or src_path.name))

    async def copy_from_workspace(self, rollout_id: str, src_filename: str, dst_path: Path) -> None:
        shutil.copyfile(self.workspaces[rollout_id] / src_filename, dst_path)

    async def compute_reward(
        self, rollout_id: str, completion: str, ground_truth: Any, **kwargs: Any
    ) -> dict[str, float]:
        note = self.workspaces[rollout_id] / NOTE
        found = re.search(r"<answer>(.*?)</answer>", completion, re.S)
        return {
            "note": float(note.exists() and note.read_text() == ground_truth),
            "answer": float(found is not None and found.group(1).strip() == ground_truth),
        }

    def cleanup_rollout(self, rollout_id: str) -> None:
        workspace = self.workspaces.pop(rollout_id, None)
        if workspace is not None:
            shutil.rmtree(workspace, ignore_errors=True)

    def dataset_preprocess(self, example: Any) -> StandardizedExample:
        return StandardizedExample(
            prompt=f"Remember the word {example['word']}", ground_truth=example["word"], init_rollout_args={}
        )
